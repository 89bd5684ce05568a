# Shared helpers for the rule files.  Rules call the `dpaudit` CLI with their config
# section as JSON (`--spec`) and write into results/ and figures/.
import json
import os
import shlex
import shutil
import sys
import sysconfig

import torch

# Every rule file appends the figures (PDF; a PNG is written beside each) it renders, and
# the tables it adds to the report.
FIGURES = []
# The project's environment (README, Set up), what every job runs in.  It documents the
# software only; `--sdm conda` is refused in the Snakefile.
ENV = "../../environment.yml"
# Jobs call `dpaudit`: the command installed with the Python that runs Snakemake (whose
# dpaudit built this DAG), so its scripts folder goes first on PATH, which every job
# inherits (SLURM jobs too: the plugin submits with --export=ALL).  A venv's snakemake
# then works without activating the venv.  Beside it, workflow/scripts: `logged`, which
# runs the command of every cluster job and keeps the log of a failed attempt.
def _dpaudit_bin():
    folders = [sysconfig.get_path("scripts"), sysconfig.get_path("scripts", f"{os.name}_user")]
    for folder in folders:
        if os.path.isfile(os.path.join(folder, "dpaudit")):
            return folder
    found = shutil.which("dpaudit")  # installed without scripts (PYTHONPATH) plus a wrapper
    if found:
        return os.path.dirname(found)
    raise WorkflowError(
        f"dpaudit: command not found: the jobs call the `dpaudit` command of the Python "
        f"that runs snakemake ({sys.executable}), but it is not in {' or '.join(folders)} "
        "nor on PATH: install the project into that environment (`pip install -e .` in the "
        "repository, README, Set up) and run that environment's snakemake"
    )


os.environ.update(
    PATH=os.pathsep.join(
        [_dpaudit_bin(), os.path.join(workflow.basedir, "workflow", "scripts")]
        + os.environ.get("PATH", "").split(os.pathsep)
    )
)

# The GPUs torch sees here. Training jobs each ask for GPU_PER_JOB GPUs (1 where there are
# GPUs; 0 on a CPU-only machine, where they run as CPU jobs, as many as the cores allow).
# The SLURM profile asks for one GPU per training job whatever the submitting node has.
GPUS = torch.cuda.device_count()
GPU_PER_JOB = 1 if GPUS else 0
# At most as many training jobs at once as there are GPUs; `--resources gpu=N` overrides.
# The executor is not known yet when this file is read, so a cluster profile must set its
# own gpu limit (profiles/slurm does), or this cap (often 0 on a login node) would strip
# the GPUs from the jobs it submits.
if "gpu" not in workflow.global_resources:
    workflow.register_resource("gpu", GPUS)


def job_device(setting):
    """The `--device` param of a training job: `auto` is `cuda` where the job reserves a
    GPU, so that a job whose torch cannot use CUDA fails instead of training on the CPU."""
    return lambda wildcards, resources: (
        "cuda" if setting == "auto" and resources.get("gpu", 0) else setting
    )


def quoted_json(value):
    """`value` as a shell-quoted JSON string."""
    return shlex.quote(json.dumps(value, sort_keys=True))


def spec(*keys, **extra):
    """The config section at `keys` (plus `extra`) as a shell-quoted JSON string."""
    section = config
    for key in keys:
        section = section[key]
    return quoted_json({**section, **extra})
