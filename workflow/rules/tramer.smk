# Debugging DP with audits (Tramer et al. 2022): the buggy and the fixed DP-SGD at the same
# claimed (eps, delta), and `audit_user`, the config-driven audit of your own training
# function (docs/audit_your_implementation.md; not part of `all`).
from dpaudit.cli.tramer import SPEC_KEYS as TRAMER_KEYS

FIGURES.append("figures/tramer_canary_losses.pdf")
# Result table -> (`dpaudit tramer-audit --target`, figure name).
TRAMER = {"tramer_audit": ("case-study", "tramer"), "audit_user": ("user", "audit_user")}
TRAMER_TABLE = {figure: table for table, (_, figure) in TRAMER.items()}


rule tramer_audit:
    input:
        "results/data/fmnist.csv",
    output:
        table="results/{name}.csv",
        losses="results/{name}_losses.csv",
    wildcard_constraints:
        name="tramer_audit|audit_user",
    params:
        target=lambda wc: TRAMER[wc.name][0],
        spec=lambda wc: quoted_json(
            {k: config["tramer"][k] for k in TRAMER_KEYS[TRAMER[wc.name][0]]}
        ),
        data=spec("data"),
        seed=config["seed"],
        device=job_device(config["tramer"]["device"]),
        # Kept batches of runs: a rerun (a timed-out cluster job) trains only the rest.
        store="results/tramer/trained/{name}",
    threads: 2
    resources:
        **job(
            mem_mb=4000,
            cpu_s=1.7e-3,
            gpu_s=2.0e-5,
            per=lambda wc: tramer_run_epochs(config["tramer"], wc.name),
        ),
    log:
        "logs/{name}.log",
    conda:
        ENV
    shell:
        "logged {log} dpaudit tramer-audit --target {params.target} --spec {params.spec}"
        " --data {params.data} --device {params.device} --seed {params.seed}"
        " --out {output.table}"
        " --losses {output.losses} --store {params.store}"


rule tramer_plot:
    input:
        table=lambda wc: f"results/{TRAMER_TABLE[wc.figure]}.csv",
        losses=lambda wc: f"results/{TRAMER_TABLE[wc.figure]}_losses.csv",
    output:
        pdf="figures/{figure}_canary_losses.pdf",
        png=report(
            "figures/{figure}_canary_losses.png",
            caption="../report/tramer.rst",
            category="Tramer et al. 2022",
            subcategory="{figure}",
        ),
    wildcard_constraints:
        figure="tramer|audit_user",
    localrule: True
    log:
        "logs/{figure}_plot.log",
    conda:
        ENV
    shell:
        "dpaudit tramer-plot --table {input.table} --losses {input.losses} "
        "--out {output.pdf} 2> {log}"


# Named target: `snakemake tramer` (the rule `tramer_audit` has a wildcard: it is no target).
rule tramer:
    input:
        "figures/tramer_canary_losses.pdf",


# `snakemake --cores all audit_user`: the table and the figure of your implementation.
rule audit_user:
    input:
        "results/audit_user.csv",
        "figures/audit_user_canary_losses.pdf",


# The case study of a paper-scale GPU run (config `reference_dir`, reference/README.md),
# drawn on any CPU without training or data: `snakemake --cores 1 tramer_reference`.
# Its two tables come from `dpaudit tramer-reaudit` on that run's per-run losses.
rule tramer_reference_plot:
    input:
        table=os.path.join(REFERENCE, "tramer_audit.csv"),
        hist=os.path.join(REFERENCE, "tramer_audit_hist.csv"),
    output:
        pdf="figures/reference/tramer_canary_losses.pdf",
        png="figures/reference/tramer_canary_losses.png",
    localrule: True
    log:
        "logs/tramer_reference_plot.log",
    conda:
        ENV
    shell:
        "dpaudit tramer-plot --table {input.table} --hist {input.hist} --out {output.pdf}"
        " 2> {log}"


rule tramer_reference:
    input:
        "figures/reference/tramer_canary_losses.pdf",
