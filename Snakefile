# dpaudit: empirical privacy auditing of DP machine learning.
# Full reproduction:  snakemake --cores all
# Quick (2 CPU cores, minutes):  snakemake --cores all --configfile config/quick.yaml
# One figure:  snakemake --cores all figures/hw3_eps_vs_m.pdf
# Report of every figure (after a run):  snakemake --report report.zip
import os
import sys

from snakemake.exceptions import WorkflowError
from snakemake.settings.types import DeploymentMethod
from snakemake.utils import min_version

min_version("9.0")

# The rule files build the experiment grids with dpaudit, in Snakemake's own process, so
# dpaudit must be installed where snakemake runs (the rules call its `dpaudit` CLI).
try:
    from dpaudit.config import SpecError, typed_from_text, validate_section
    from dpaudit.experiments.checks import check_config
except ImportError as err:
    raise WorkflowError(
        f"cannot import dpaudit ({err}): install the project into the environment that runs "
        "snakemake, `pip install -e .` in the repository (README, Set up)"
    )

# Snakemake would build environment.yml from its own copy under .snakemake/conda/, where
# the file's `pip install -e .` finds no project; the rules need dpaudit in Snakemake's
# process anyway.  So one environment for both, made by hand (README, Set up).
if DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method:
    raise WorkflowError(
        "--sdm conda is not supported: create the environment once with `conda env create "
        "-f environment.yml` at the repository root, `conda activate dpaudit`, and run "
        "snakemake in it without --sdm conda"
    )


# Relative to this file, so `--directory` can point anywhere (results go there).
configfile: os.path.join(workflow.basedir, "config", "config.yaml")


# The project's validator, not snakemake.utils.validate: one line naming the key and what
# is allowed instead of a dump of the schema.  Numbers and booleans inside a nested
# `--config` entry arrive as text: read as the schema wants them first.
# Then the limits that relate several keys (sizes against the data sets, one grid against
# another), once, before any job runs.
try:
    validate_section(typed_from_text(config))
    check_config(config)
except SpecError as err:
    raise WorkflowError(f"invalid config: {err}")


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/hw3.smk"
include: "workflow/rules/accounting.smk"
include: "workflow/rules/ridge.smk"
include: "workflow/rules/jagielski.smk"
include: "workflow/rules/trials_needed.smk"
include: "workflow/rules/onerun.smk"
include: "workflow/rules/tramer.smk"
include: "workflow/rules/abadi.smk"
include: "workflow/rules/tight.smk"
include: "workflow/rules/shuffle.smk"
include: "workflow/rules/flaws.smk"
include: "workflow/rules/report.smk"


# Defined here, not in an included file: an included file's default target is dropped.
rule all:
    default_target: True
    input:
        FIGURES,


# Failures whose messages from Snakemake or its SLURM plugin do not say what to do: one
# line more, found in the run's log.  (A job's "command exited with non-zero exit code"
# may be a submission SLURM refused.)
FAILURE_HINTS = {
    "Invalid generic resource (gres) specification": (
        "SLURM refused a job's GPU (--gpus=1): this cluster or partition has no GPUs. Run "
        "with --profile profiles/slurm-cpu, or export DPAUDIT_SLURM_GPU_PARTITION=<a "
        "partition with GPUs> (docs/scale.md, SLURM)"
    ),
    "SLURM status is: 'TIMEOUT'": (
        "a job reached its time limit: give its rule more with --set-resources "
        "RULE:runtime=MINUTES (the rule is named above; docs/scale.md, Job sizes) and run "
        "the same command again"
    ),
}


onerror:
    # `log`: the run's log files (a list in Snakemake 9).
    logs = [log] if isinstance(log, str) else log or []
    text = "".join(open(f, errors="replace").read() for f in logs if os.path.isfile(f))
    for needle, hint in FAILURE_HINTS.items():
        if needle in text:
            print(f"dpaudit: {hint}", file=sys.stderr)


# The figures of the kept runs' tables in reference/ (the paper-scale GPU run, and the tight
# audits' full table measured on 2 CPU cores), on any CPU, without training or data:
# `snakemake --cores 1 reference`.
rule reference:
    input:
        "figures/reference/jagielski_fig2.pdf",
        "figures/reference/jagielski_table2.pdf",
        "results/reference/jagielski_table2.md",
        "figures/reference/tramer_canary_losses.pdf",
        "figures/reference/trials_needed.pdf",
        "figures/reference/tight_audit.pdf",
        "figures/reference/shuffle_audit.pdf",
        "figures/reference/flaws_audit.pdf",


# Last, when every rule is known: a target that no rule makes (common.smk).
check_targets()
