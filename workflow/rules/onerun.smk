# One-run audits of DP-SGD (Steinke et al. 2023; Mahloujifar et al. 2025) on the FMNIST
# cells of Jagielski et al.'s Figure 2: one job for the whole grid (minutes on a CPU).
from dpaudit.cli import fmnist_train
from dpaudit.cli.onerun import AUDIT_KEYS as ONERUN_KEYS

FIGURES.append("figures/onerun_dpsgd.pdf")
ONERUN = config["onerun"]
FMNIST = config["jagielski"]["datasets"]["fmnist"]
# The many-model ClipBKD cells of the same set-up (shared with Figure 2 when it has them).
ONERUN_GRID = grid_cells(JAG, ONERUN)["onerun"]
ONERUN_CELLS = [cell_path(*cell) for cell in ONERUN_GRID]


rule onerun_audit:
    input:
        task="results/jagielski/task_fmnist.npz",
        # `init: fixed`: the saved initialisation the Jagielski fixed-init cells share.
        inits=(
            [f"results/jagielski/init_fmnist_{arch}.pt" for arch in ONERUN["archs"]]
            if ONERUN["init"] == "fixed"
            else []
        ),
    output:
        "results/onerun_dpsgd.csv",
    params:
        # Only what the audit depends on: editing the plot's keys or another eps's noise
        # reruns nothing.
        spec=quoted_json({k: ONERUN[k] for k in ONERUN_KEYS}),
        train=quoted_json(fmnist_train(JAG, {e: FMNIST["noise"][e] for e in ONERUN["eps"]})),
        seed=config["seed"],
        device=job_device(config["jagielski"]["device"]),
        inits=lambda wc, input: f"--init-files {input.inits}" if input.inits else "",
    threads: 2
    resources:
        # A CPU job: on the H100 it took as long as on 2 CPU cores.
        **job(
            mem_mb=2000, cpu_s=0.03, per=lambda wc: onerun_run_epochs(ONERUN, FMNIST["epochs"])
        ),
    log:
        "logs/onerun_audit.log",
    conda:
        ENV
    shell:
        "logged {log} dpaudit onerun-audit --task {input.task} --spec {params.spec}"
        " --train {params.train} {params.inits} --device {params.device} --seed {params.seed}"
        " --out {output}"


rule onerun_many_model:
    input:
        group_dirs(ONERUN_GRID),
    output:
        "results/onerun_many_model.csv",
    params:
        scores=ONERUN_CELLS,
        spec=AUDIT_SPEC,
        seed=config["seed"],
    localrule: True
    log:
        "logs/onerun_many_model.log",
    conda:
        ENV
    shell:
        "dpaudit jagielski-audit --experiment fig2 --scores {params.scores} --spec {params.spec}"
        " --seed {params.seed} --out {output} 2> {log}"


rule onerun_plot:
    input:
        table="results/onerun_dpsgd.csv",
        many_model=(
            ["results/onerun_many_model.csv"] if ONERUN["compare_many_model"] else []
        ),
    output:
        pdf="figures/onerun_dpsgd.pdf",
        png=report(
            "figures/onerun_dpsgd.png",
            caption="../report/onerun_dpsgd.rst",
            category="One-run audits of DP-SGD",
            subcategory="FMNIST, Figure 2 cells",
        ),
    localrule: True
    log:
        "logs/onerun_plot.log",
    conda:
        ENV
    shell:
        # Chosen when the workflow is read (no params: the report would show a CLI fragment).
        "dpaudit onerun-plot --table {input.table}"
        + (" --many-model {input.many_model}" if ONERUN["compare_many_model"] else "")
        + " --out {output.pdf} 2> {log}"


# Named target: `snakemake onerun`.
rule onerun:
    input:
        "figures/onerun_dpsgd.pdf",
