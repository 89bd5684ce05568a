# Shared helpers for the rule files.  Rules call the `dpaudit` CLI with their config
# section as JSON (`--spec`) and write into results/ and figures/.
import json
import shlex

import torch

# Every rule file appends the figures (PDF; a PNG is written beside each) it renders, and
# the tables it adds to the report.
FIGURES = []
# The environment of every rule: the project's (README, Set up).  It documents the
# software only; `--sdm conda` is refused in the Snakefile.
ENV = "../../environment.yml"
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


def quoted_json(value):
    """`value` as a shell-quoted JSON string."""
    return shlex.quote(json.dumps(value, sort_keys=True))


def spec(*keys, **extra):
    """The config section at `keys` (plus `extra`) as a shell-quoted JSON string."""
    section = config
    for key in keys:
        section = section[key]
    return quoted_json({**section, **extra})
