# Shared helpers for the rule files.  Rules call the `dpaudit` CLI with their config
# section as JSON (`--spec`) and write into results/ and figures/.
import json
import math
import os
import shlex
import shutil
import sys
import sysconfig

from dpaudit.device import gpu_count


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

# Training asks for a GPU wherever the run has GPUs: `jobs_per_gpu` places on each GPU
# torch sees here (or DPAUDIT_FORCE_GPU describes: a dry run on the CPU,
# dpaudit.device.gpu_count), or a limit set with `--resources gpu=N` (at most N training
# jobs at once).  A cluster profile sets that limit, since the executor is not known yet
# when this file is read and the submitting host often has no GPU: profiles/slurm a large
# one (each SLURM job gets a GPU of its own), profiles/slurm-cpu 0.  Without GPUs the training
# jobs run as CPU jobs, as many at once as the cores allow.  Jobs of a local run learn
# how many share their card from DPAUDIT_JOBS_PER_GPU (dpaudit.device.jobs_per_gpu).
# A cluster job runs this file again in its own Snakemake (`--mode remote`, inside it a
# local executor), without the run's `--resources`: it takes the submitting host's
# decision from RUN_GPUS_VAR (SLURM jobs inherit the environment), so that a job that
# reserved a GPU keeps `--device cuda`, and has its GPU to itself: DPAUDIT_JOBS_PER_GPU
# is not set (a site that shards GPUs exports it itself: docs/scale.md, SLURM).
RUN_GPUS_VAR = "DPAUDIT_RUN_HAS_GPUS"
if workflow.remote_exec:
    GPU_PER_JOB = int(os.environ.get(RUN_GPUS_VAR) or gpu_count() > 0)
    if "gpu" not in workflow.global_resources:
        workflow.register_resource("gpu", GPU_PER_JOB)
else:
    if "gpu" not in workflow.global_resources:
        workflow.register_resource("gpu", gpu_count() * config["jobs_per_gpu"])
    GPU_PER_JOB = 1 if workflow.global_resources["gpu"].value else 0
    os.environ[RUN_GPUS_VAR] = str(GPU_PER_JOB)


# Whether the run is local is known only when it starts: Snakemake picks the executor after
# reading the workflow, and a cluster run's jobs inherit the submitting host's environment.
onstart:
    if workflow.local_exec:
        os.environ.update(DPAUDIT_JOBS_PER_GPU=str(config["jobs_per_gpu"]))


def job_device(setting):
    """The `--device` param of a training job: `auto` is `cuda` where the job reserves a
    GPU, so that a job whose torch cannot use CUDA fails instead of training on the CPU."""
    return lambda wildcards, resources: (
        "cuda" if setting == "auto" and resources.get("gpu", 0) else setting
    )


# What a job that runs on a cluster node asks for: a GPU if it trains and the run has
# GPUs; a time limit (SLURM's --time): its work in the config at the speed measured for
# its rule (docs/scale.md, "Job sizes") times MARGIN, at least MIN_MINUTES, times the
# attempt's number; the memory measured, plus CUDA_HOST_MB with a GPU; the account and
# partition set in the environment (each only where set).  Local runs use only `gpu`.
MIN_MINUTES = 10
# Covers a GPU up to 5 times slower than the H100 the GPU speeds come from, and CPU cores
# up to 3 times slower than the 2 the CPU speeds come from.
MARGIN = {"gpu": 5, "cpu": 3}
# The pretrainings keep no partial progress: stopped at their limit, they start over, so
# their limits have RESTART_MARGIN times the margin.
RESTARTS = ("jagielski_task", "abadi_features")
RESTART_MARGIN = 2
# CUDA's libraries and context in host memory (an allowance: the GPU run measured only the
# GPU's memory).
CUDA_HOST_MB = 4000
ACCOUNT = os.environ.get("DPAUDIT_SLURM_ACCOUNT")
PARTITION = {
    "cpu": os.environ.get("DPAUDIT_SLURM_PARTITION"),
    "gpu": os.environ.get("DPAUDIT_SLURM_GPU_PARTITION"),
}


def job(mem_mb, cpu_s, gpu_s=None, per=None, gpu=None):
    """The `resources` of jobs that run on cluster nodes, for their rule.
    `per(wildcards)`: a job's units of work (default 1); `cpu_s`: measured seconds per
    unit on 2 CPU cores; `mem_mb`: the measured peak memory there, MB. The rules that
    train give `gpu_s`, the measured seconds per unit on one H100: their jobs ask for a
    GPU where the run has GPUs and, given `gpu(wildcards)`, where that is true."""
    uses_gpu = lambda wc: GPU_PER_JOB if gpu_s and (gpu is None or gpu(wc)) else 0
    kind = lambda wc: "gpu" if uses_gpu(wc) else "cpu"

    def runtime(wildcards, attempt, rulename):
        seconds = (per(wildcards) if per else 1) * (gpu_s if uses_gpu(wildcards) else cpu_s)
        margin = MARGIN[kind(wildcards)] * (RESTART_MARGIN if rulename in RESTARTS else 1)
        return attempt * max(MIN_MINUTES, math.ceil(margin * seconds / 60))

    resources = {"runtime": runtime, "mem_mb": lambda wc: mem_mb + CUDA_HOST_MB * uses_gpu(wc)}
    if gpu_s:
        resources["gpu"] = uses_gpu
    if ACCOUNT:
        resources["slurm_account"] = ACCOUNT
    if any(PARTITION.values()):
        resources["slurm_partition"] = lambda wc: PARTITION[kind(wc)]
    return resources


# Units of work of the jobs whose time grows with the config (`job(per=...)`).
def model_epochs(jag, dataset, attack, cells):
    """A training job (a group of `cells`): models (trials per side and cell) x epochs."""
    sides = 2 if attack == "mi" else 1 + len(jag["ks"])
    return cells * jag["trials"] * sides * jag["datasets"][dataset]["epochs"]


def pretrain_image_epochs(jag, dataset):
    """A task job: CIFAR-10's pretraining (all images: CIFAR-100's 50,000 at most); FMNIST's
    only reads the data."""
    cifar = jag["datasets"]["cifar"]
    return cifar["pretrain_epochs"] * (cifar["pretrain_images"] or 50_000) * (dataset == "cifar")


def tramer_run_epochs(tramer, name):
    """A Tramer et al. audit: runs (evaluation and validation, each side and implementation)
    x epochs; your own function (`audit_user`) counts as DP-SGD."""
    impls, sec = tramer["implementations"], tramer
    if name == "audit_user":
        impls, sec = ["user"], tramer["user"]
    return 2 * len(impls) * (sec["runs"] + sec["val_runs"]) * tramer["model"]["epochs"]


def onerun_run_epochs(onerun, epochs):
    """The one-run audit job: runs (each with its m canaries) x epochs."""
    runs = onerun["repeats"] * len(onerun["archs"]) * len(onerun["eps"]) * len(onerun["canaries"])
    return runs * epochs


# Seconds of one full-size epoch of Abadi et al.'s figures on 2 CPU cores (docs/scale.md:
# 8.5 and 4.8 CPU seconds), and the images of a full-size epoch.
ABADI_EPOCH = {"fig3": (4.3, "n_train", 60_000), "fig6": (2.4, "private_images", 40_000)}


def abadi_cpu_seconds(abadi, figure):
    """An Abadi et al. training job on 2 CPU cores: its most epochs (a level stops earlier,
    at its eps) at the measured seconds per epoch, scaled by its images (0: all)."""
    seconds, key, full = ABADI_EPOCH[figure]
    section = abadi[figure]
    return section["max_epochs"] * seconds * (section[key] or full) / full


def hw3_draws(hw3, grid):
    """An HW3 sweep: Gaussian coordinates drawn, repeats x m x d over its points."""
    axes = hw3["grids"][grid]
    return hw3["repeats"] * len(axes["eps"]) * sum(m * d for m in axes["m"] for d in axes["d"])


def quoted_json(value):
    """`value` as a shell-quoted JSON string."""
    return shlex.quote(json.dumps(value, sort_keys=True))


def spec(*keys, **extra):
    """The config section at `keys` (plus `extra`) as a shell-quoted JSON string."""
    section = config
    for key in keys:
        section = section[key]
    return quoted_json({**section, **extra})


# A target that no rule makes, and that is no file, stops the run naming what can be
# asked for, instead of Snakemake's bare MissingRuleException.  Snakemake hands the
# workflow its targets only after the Snakefile has run, so they are read from its
# command line.  (A target that reads as a config file is refused by Snakemake before
# the Snakefile runs: README, Run, on `--`.)
def check_targets():
    """Called at the end of the Snakefile, when every rule is defined."""
    from snakemake.cli import parse_args

    argv0 = sys.argv[0] if sys.argv else ""
    if workflow.remote_exec or "snakemake" not in argv0:  # a job, or the API
        return
    try:
        targets = parse_args(sys.argv[1:])[1].targets or []
    except SystemExit:
        return
    names = {found.name for found in workflow.rules}
    unknown = sorted(t for t in targets if t not in names and not os.path.exists(t)
                     and not any(found.is_producer(t) for found in workflow.rules))
    if unknown:
        named = sorted(found.name for found in workflow.rules if not found.output)
        # the default target's figures and those of the named targets (tight, reference...)
        figures = sorted({str(f) for f in FIGURES + [f for found in workflow.rules
                                                     if not found.output for f in found.input]
                          if str(f).startswith("figures/") and str(f).endswith(".pdf")})
        guesses = {t: did_you_mean(t, named + figures) for t in unknown}
        said = " ".join(f"{t}: no rule makes it{guesses[t]}." for t in unknown)
        if all(guesses.values()):  # a typo: the guess, not the whole list
            raise WorkflowError(f"{said} The targets: README, Run.")
        raise WorkflowError(
            f"{said} A target is a name (" + ", ".join(named) + "), a figure ("
            + ", ".join(figures) + ") or any other file a rule writes (README, Run)"
        )


def did_you_mean(target, known):
    """" (did you mean X?)" with the closest of ``known`` (difflib), or nothing."""
    import difflib

    close = difflib.get_close_matches(target, known, n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


# A data folder that does not exist, offline: the data jobs would fail, and a dry run would
# say nothing of it. Named at start-up (a warning: targets without data still run).
def check_data_root():
    data = config.get("data") or {}
    root = data.get("root")
    missing = root and not os.path.isdir(os.path.expanduser(root))
    if missing and not data.get("download") and not workflow.remote_exec:
        print(f"dpaudit: warning: data.root = {root}: no such folder, and data.download is "
              "false: every job that reads Fashion-MNIST or CIFAR-10 will fail. Create it and "
              "put the data there, or correct data.root (docs/data.md, section Offline).",
              file=sys.stderr)


check_data_root()
