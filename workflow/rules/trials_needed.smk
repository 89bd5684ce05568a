# How many trials each way from counts to epsilon needs: the score tables of a few cells
# the jagielski grids already train (jagielski.smk's GRID), subsampled; no training.
from dpaudit.experiments.trials_needed import cells as trials_needed_cells

FIGURES.append("figures/trials_needed.pdf")
TN_CELLS = trials_needed_cells(config["trials_needed"], JAG, _ONERUN)


rule trials_needed_table:
    input:
        group_dirs(TN_CELLS),
    output:
        table="results/trials_needed.csv",
        summary="results/trials_needed_summary.csv",
        md="results/trials_needed.md",
    params:
        scores=[cell_path(*c) for c in TN_CELLS],
        spec=spec("trials_needed"),
        audit=AUDIT_SPEC,
        seed=config["seed"],
    localrule: True
    log:
        "logs/trials_needed_table.log",
    conda:
        ENV
    shell:
        "dpaudit trials-needed --scores {params.scores} --spec {params.spec} --audit {params.audit}"
        " --seed {params.seed} --out {output.table} --summary {output.summary}"
        " --md {output.md} 2> {log}"


rule trials_needed_plot:
    input:
        table="results/trials_needed.csv",
        summary="results/trials_needed_summary.csv",
    output:
        pdf="figures/trials_needed.pdf",
        png=report(
            "figures/trials_needed.png",
            caption="../report/trials_needed.rst",
            category="Jagielski et al. 2020",
            subcategory="trials needed",
        ),
    localrule: True
    log:
        "logs/trials_needed_plot.log",
    conda:
        ENV
    shell:
        "dpaudit trials-needed-plot --table {input.table} --summary {input.summary}"
        " --out {output.pdf} 2> {log}"


# Named target: `snakemake trials_needed`.
rule trials_needed:
    input:
        "figures/trials_needed.pdf",
        "results/trials_needed.md",


# The study of a paper-scale GPU run's score tables (config `reference_dir`,
# reference/README.md), drawn on any CPU without training or data:
# `snakemake --cores 1 trials_needed_reference`.
use rule trials_needed_plot as trials_needed_reference_plot with:
    input:
        table=os.path.join(REFERENCE, "trials_needed.csv"),
        summary=os.path.join(REFERENCE, "trials_needed_summary.csv"),
    output:
        pdf="figures/reference/trials_needed.pdf",
        png="figures/reference/trials_needed.png",
    log:
        "logs/trials_needed_reference_plot.log",


rule trials_needed_reference:
    input:
        "figures/reference/trials_needed.pdf",
