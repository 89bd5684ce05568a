# One-run audits of DP-SGD (Steinke et al. 2023; Mahloujifar et al. 2025) on the FMNIST
# cells of Jagielski et al.'s Figure 2: one job for the whole grid (minutes on a CPU).
FIGURES.append("figures/onerun_dpsgd.pdf")
ONERUN = config["onerun"]


rule onerun_audit:
    input:
        "results/jagielski/task_fmnist.npz",
    output:
        "results/onerun_dpsgd.csv",
    params:
        spec=spec("onerun"),
        train=quoted_json(
            {
                **{
                    k: config["jagielski"]["datasets"]["fmnist"][k]
                    for k in ("epochs", "batch_size", "lr", "hidden", "noise")
                },
                "clip": config["jagielski"]["fig2"]["clip"],
                "init": config["jagielski"]["fig2"]["init"],
            }
        ),
        seed=config["seed"],
        device=config["jagielski"]["device"],
    threads: 2
    resources:
        gpu=GPU_PER_JOB,
    log:
        "logs/onerun_audit.log",
    conda:
        ENV
    shell:
        "dpaudit onerun-audit --task {input} --spec {params.spec} --train {params.train}"
        " --device {params.device} --seed {params.seed} --out {output} 2> {log}"


rule onerun_plot:
    input:
        table="results/onerun_dpsgd.csv",
        many_model=(
            ["results/jagielski_fig2.csv"] if ONERUN["compare_many_model"] else []
        ),
    output:
        pdf="figures/onerun_dpsgd.pdf",
        png="figures/onerun_dpsgd.png",
    params:
        many_model=lambda wc, input: (
            f"--many-model {input.many_model}" if input.many_model else ""
        ),
    log:
        "logs/onerun_plot.log",
    conda:
        ENV
    shell:
        "dpaudit onerun-plot --table {input.table} {params.many_model} --out {output.pdf}"
        " 2> {log}"


# Named target: `snakemake onerun`.
rule onerun:
    input:
        "figures/onerun_dpsgd.pdf",
