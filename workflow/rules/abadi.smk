# Abadi et al. 2016, Figures 3 (MNIST, DP-PCA) and 6 (CIFAR-10 on pretrained features):
# one DP-SGD run per noise level, measured after every epoch, with the moments
# accountant's eps.  The levels of a figure cannot share one wide training step: each
# Figure 3 level trains on its own DP-PCA projection, and the Figure 6 levels differ in
# lot size (or only in where they stop); so one job per level, run side by side.
from dpaudit.experiments.abadi import FEATURE_KEYS, job_spec, level_paths, levels

FIGURES += ["figures/abadi_fig3.pdf", "figures/abadi_fig6.pdf"]
ABADI = config["abadi"]
try:
    ABADI_LEVELS = {f: levels(ABADI, f) for f in ("fig3", "fig6")}
except ValueError as err:
    raise WorkflowError(f"invalid config: {err}")


rule abadi_features:
    input:
        "results/data/cifar.csv",
    output:
        "results/abadi/fig6_features.npz",
    params:
        spec=quoted_json(job_spec(ABADI, "fig6", FEATURE_KEYS)),
        data=spec("data"),
        seed=config["seed"],
        device=job_device(ABADI["device"]),
    threads: 2
    resources:
        # The CIFAR CNN of jagielski_task: the same seconds per image-epoch.
        **job(
            mem_mb=3000,
            cpu_s=9.0e-3,
            gpu_s=7.5e-5,
            per=lambda wc: ABADI["fig6"]["pretrain_epochs"] * ABADI["fig6"]["public_images"],
        ),
    log:
        "logs/abadi_features.log",
    conda:
        ENV
    shell:
        "logged {log} dpaudit abadi-features --spec {params.spec} --data {params.data}"
        " --device {params.device} --seed {params.seed} --out {output}"


rule abadi_train:
    input:
        lambda wc: (
            "results/data/{}.csv".format(ABADI["fig3"]["dataset"])
            if wc.figure == "fig3"
            else "results/abadi/fig6_features.npz"
        ),
    output:
        "results/abadi/{figure}_{level}.csv",
    wildcard_constraints:
        figure="fig3|fig6",
        level="[a-z0-9_]+",
    params:
        spec=lambda wc: quoted_json(job_spec(ABADI, wc.figure)),
        level=lambda wc: quoted_json(ABADI_LEVELS[wc.figure][wc.level]),
        source=lambda wc, input: (
            f"--data {spec('data')}" if wc.figure == "fig3" else f"--features {input}"
        ),
        seed=config["seed"],
        device=job_device(ABADI["device"]),
    threads: 2
    resources:
        # Not measured on a GPU: its time is taken as the 2 CPU cores', an upper bound.
        **job(mem_mb=3000, cpu_s=1, gpu_s=1, per=lambda wc: abadi_cpu_seconds(ABADI, wc.figure)),
    log:
        "logs/abadi_train/{figure}_{level}.log",
    conda:
        ENV
    shell:
        "logged {log} dpaudit abadi-train --figure {wildcards.figure} --spec {params.spec}"
        " --level {params.level} {params.source} --device {params.device}"
        " --seed {params.seed} --out {output}"


rule abadi_table:
    input:
        level_paths(ABADI, "fig3") + level_paths(ABADI, "fig6"),
    output:
        "results/abadi_accuracy.csv",
    localrule: True
    log:
        "logs/abadi_table.log",
    conda:
        ENV
    shell:
        "dpaudit abadi-table --tables {input} --out {output} 2> {log}"


rule abadi_plot:
    input:
        "results/abadi_accuracy.csv",
    output:
        pdf="figures/abadi_{figure}.pdf",
        png=report(
            "figures/abadi_{figure}.png",
            caption="../report/abadi.rst",
            category="Abadi et al. 2016",
            subcategory="{figure}",
        ),
    wildcard_constraints:
        figure="fig3|fig6",
    localrule: True
    log:
        "logs/abadi_plot_{figure}.log",
    conda:
        ENV
    shell:
        "dpaudit abadi-plot --figure {wildcards.figure} --table {input} --out {output.pdf}"
        " 2> {log}"


# Named target: `snakemake abadi` (both figures and their table).
rule abadi:
    input:
        "figures/abadi_fig3.pdf",
        "figures/abadi_fig6.pdf",
