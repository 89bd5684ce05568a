# Debugging DP with audits (Tramer et al. 2022, seed 000): the buggy and the fixed DP-SGD at
# the same claimed (eps, delta), and `audit_user`, the config-driven audit of your own
# training function (docs/audit_your_implementation.md; not part of `all`).
FIGURES.append("figures/tramer_canary_losses.pdf")


rule tramer_audit:
    output:
        table="results/tramer_audit.csv",
        losses="results/tramer_losses.csv",
    params:
        train=" ".join(config["tramer"]["implementations"]),
        eps=config["tramer"]["eps"],
        delta=config["tramer"]["delta"],
        canary=config["tramer"]["canary"],
        runs=config["tramer"]["runs"],
        val_runs=config["tramer"]["val_runs"],
        alpha=config["tramer"]["alpha"],
        batch_runs=config["tramer"]["batch_runs"],
        classes=",".join(str(c) for c in config["tramer"]["classes"]),
        n_train=config["tramer"]["n_train"],
        spec=spec("tramer", "model"),
        data=DATA_ARGS,
        seed=config["seed"],
    log:
        "logs/tramer_audit.log",
    conda:
        ENV
    shell:
        "dpaudit audit-impl --train {params.train} --eps {params.eps} --delta {params.delta} "
        "--alpha {params.alpha} --canary {params.canary} --runs {params.runs} "
        "--val-runs {params.val_runs} --batch-runs {params.batch_runs} "
        "--classes {params.classes} --n-train {params.n_train} --spec {params.spec} "
        "{params.data} --seed {params.seed} --out {output.table} --losses {output.losses} 2> {log}"


rule tramer_plot:
    input:
        table="results/tramer_audit.csv",
        losses="results/tramer_losses.csv",
    output:
        pdf="figures/tramer_canary_losses.pdf",
        png="figures/tramer_canary_losses.png",
    log:
        "logs/tramer_plot.log",
    conda:
        ENV
    shell:
        "dpaudit tramer-plot --table {input.table} --losses {input.losses} "
        "--out {output.pdf} 2> {log}"


rule audit_user_run:
    output:
        table="results/audit_user.csv",
        losses="results/audit_user_losses.csv",
    params:
        train=shlex.quote(config["tramer"]["user"]["train"]),
        eps=config["tramer"]["user"]["eps"],
        delta=config["tramer"]["user"]["delta"],
        canary=config["tramer"]["user"]["canary"],
        runs=config["tramer"]["user"]["runs"],
        val_runs=config["tramer"]["user"]["val_runs"],
        alpha=config["tramer"]["alpha"],
        batch_runs=config["tramer"]["batch_runs"],
        classes=",".join(str(c) for c in config["tramer"]["classes"]),
        n_train=config["tramer"]["n_train"],
        spec=shlex.quote(config["tramer"]["user"]["spec"]),
        data=DATA_ARGS,
        seed=config["seed"],
    log:
        "logs/audit_user_run.log",
    conda:
        ENV
    shell:
        "dpaudit audit-impl --train {params.train} --eps {params.eps} --delta {params.delta} "
        "--alpha {params.alpha} --canary {params.canary} --runs {params.runs} "
        "--val-runs {params.val_runs} --batch-runs {params.batch_runs} "
        "--classes {params.classes} --n-train {params.n_train} --spec {params.spec} "
        "{params.data} --seed {params.seed} --out {output.table} --losses {output.losses} 2> {log}"


rule audit_user_plot:
    input:
        table="results/audit_user.csv",
        losses="results/audit_user_losses.csv",
    output:
        pdf="figures/audit_user_canary_losses.pdf",
        png="figures/audit_user_canary_losses.png",
    log:
        "logs/audit_user_plot.log",
    conda:
        ENV
    shell:
        "dpaudit tramer-plot --table {input.table} --losses {input.losses} "
        "--out {output.pdf} 2> {log}"


# `snakemake --cores all audit_user`: the table and the figure of your implementation.
rule audit_user:
    input:
        "results/audit_user.csv",
        "figures/audit_user_canary_losses.pdf",
