# `snakemake --report`: the captions quote the config (trials, repeats, grids, claims), so
# the config must be the one that made the results; another one stops with the
# differences instead of captioning the figures with its values.
import os
import sys

from dpaudit.config import results_mismatch
from dpaudit.experiments.abadi import SHARED_KEYS as ABADI_SHARED_KEYS

# The tables of the report's figures -> (their config section, {column: key of it}[,
# {provenance entry: (config key, its value)}]).  A Jagielski table records its grid and
# what its cells were trained with in its spec; an Abadi level table its level, and the
# abadi keys shared by the figures beside its figure's.
REPORTED_TABLES = {
    **{f"results/hw3_eps_vs_{grid}.csv": ("hw3", {}) for grid in ("eps", "m", "d")},
    "results/abadi_fig2.csv": ("accounting.abadi", {}),
    "results/composition.csv": ("accounting.composition", {}),
    "results/ridge_audit.csv": ("ridge", {}),
    "results/jagielski_fig2.csv": ("jagielski", {"trials": "trials"}),
    "results/jagielski_table2.csv": ("jagielski", {"trials": "trials"}),
    "results/trials_needed.csv": ("trials_needed", {}),
    "results/onerun_dpsgd.csv": ("onerun", {}),
    "results/tramer_audit.csv": ("tramer", {}),
    **{
        f"results/abadi/{figure}_{name}.csv": (
            f"abadi.{figure}",
            {},
            {
                "level": (f"abadi.{figure}.levels.{name}", level),
                **{f"spec.{k}": (f"abadi.{k}", ABADI[k]) for k in ABADI_SHARED_KEYS},
            },
        )
        for figure, named in ABADI_LEVELS.items()
        for name, level in named.items()
    },
}


def building_report(argv):
    """`snakemake --report [FILE]` on finished results (`--report-after-run` runs first)."""
    return "--report-after-run" not in argv and any(
        a == "--report" or a.startswith("--report=") for a in argv
    )


def given_configfiles():
    """This command's --configfile files, as typed where they lie below the working folder
    (Snakemake holds them absolute)."""
    paths = [os.path.relpath(p) for p in workflow.overwrite_configfiles]
    return [r if not r.startswith("..") else str(p)
            for r, p in zip(paths, workflow.overwrite_configfiles)]


if building_report(sys.argv[1:]):
    differ = results_mismatch(config, REPORTED_TABLES)
    if differ:
        raise WorkflowError(
            "--report: the results here were made with another config than this one, and "
            "the captions would quote this one's values:\n  "
            + "\n  ".join(differ[:8])
            + (f"\n  ... and {len(differ) - 8} more" if len(differ) > 8 else "")
            + "\nBuild the report with every --configfile of the run, in its order (this "
            f"command's: {' '.join(given_configfiles()) or 'none'}; after "
            "the README's quick run: `snakemake --report report.zip --configfile "
            "config/quick.yaml`, offline `... --configfile config/quick.yaml offline.yaml`), "
            "or rerun the workflow with this config first."
        )
