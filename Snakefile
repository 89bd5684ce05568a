# dpaudit: empirical privacy auditing of DP machine learning.
# Full reproduction:  snakemake --cores all
# Quick (2 CPU cores, minutes):  snakemake --cores all --configfile config/quick.yaml
# One figure:  snakemake --cores all figures/hw3_eps_vs_m.pdf
import os

from snakemake.utils import min_version, validate

from dpaudit.config import SCHEMA_PATH

min_version("9.0")


# Relative to this file, so `--directory` can point anywhere (results go there).
configfile: os.path.join(workflow.basedir, "config", "config.yaml")


validate(config, str(SCHEMA_PATH))


include: "workflow/rules/common.smk"
include: "workflow/rules/hw3.smk"
include: "workflow/rules/accounting.smk"
include: "workflow/rules/ridge.smk"
include: "workflow/rules/jagielski.smk"
include: "workflow/rules/trials_needed.smk"
include: "workflow/rules/onerun.smk"
include: "workflow/rules/tramer.smk"


# Defined here, not in an included file: an included file's default target is dropped.
rule all:
    default_target: True
    input:
        FIGURES,
