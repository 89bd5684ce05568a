# Jagielski et al. 2020: DP-SGD audits on FMNIST and CIFAR-10.  A cell is (data set,
# model, clip, init, eps, attack) and has its own score table; one job trains the cells of
# one (data set, model, clip, init, attack) at every eps label, so that the start-up
# (imports, CUDA context, task load) is paid once per job.  Figure 2 and Table 2 share
# cells.  Each job gets only the config values its cells depend on, and keeps what it
# trains in TRAINED_DIR: when a job reruns (more eps labels, a failure halfway, a new
# models_per_call), it restores its finished cells and trains only the others.
from dpaudit.experiments.jagielski import (
    AUDIT_KEYS,
    TASK_KEYS,
    TRAINED_DIR,
    cell_path,
    check_grid,
    grid_cells,
    job_eps,
    train_spec,
)

FIGURES += [
    "figures/jagielski_fig2.pdf",
    "figures/jagielski_table2.pdf",
    "results/jagielski_table2.html",
]
JAG = config["jagielski"]
# The one-run audits compare with many-model cells of their own init.
_ONERUN = config["onerun"] if config["onerun"]["compare_many_model"] else None
check_grid(JAG, _ONERUN)
GRID = grid_cells(JAG, _ONERUN)
JOB_EPS = job_eps(JAG)
FIG2_CELLS = [cell_path(*cell) for cell in GRID["fig2"]]
TABLE2_CELLS = [cell_path(*cell) for cell in GRID["table2"]]


rule jagielski_task:
    input:
        "results/data/{dataset}.csv",
    output:
        "results/jagielski/task_{dataset}.npz",
    wildcard_constraints:
        dataset="fmnist|cifar",
    params:
        spec=lambda wc: quoted_json(
            {k: v for k, v in JAG["datasets"][wc.dataset].items() if k in TASK_KEYS}
        ),
        data=spec("data"),
        seed=config["seed"],
        device=JAG["device"],
    threads: 2
    resources:
        gpu=GPU_PER_JOB,
    log:
        "logs/jagielski_task_{dataset}.log",
    conda:
        ENV
    shell:
        "dpaudit jagielski-task --dataset {wildcards.dataset} --spec {params.spec}"
        " --data {params.data} --device {params.device} --seed {params.seed}"
        " --out {output} 2> {log}"


rule jagielski_init:
    input:
        "results/jagielski/task_{dataset}.npz",
    output:
        "results/jagielski/init_{dataset}_{arch}.pt",
    wildcard_constraints:
        dataset="fmnist|cifar",
        arch="lr|fnn",
    params:
        hidden=lambda wc: JAG["datasets"][wc.dataset]["hidden"],
        seed=config["seed"],
    log:
        "logs/jagielski_init_{dataset}_{arch}.log",
    conda:
        ENV
    shell:
        "dpaudit jagielski-init --dataset {wildcards.dataset} --arch {wildcards.arch}"
        " --task {input} --hidden {params.hidden} --seed {params.seed} --out {output}"
        " 2> {log}"


rule jagielski_train:
    input:
        task="results/jagielski/task_{dataset}.npz",
        init=lambda wc: (
            [f"results/jagielski/init_{wc.dataset}_{wc.arch}.pt"] if wc.init == "fixed" else []
        ),
    output:
        [
            f"results/jagielski/scores/{{dataset}}_{{arch}}_c{{clip}}_{{init}}_e{eps}_{{attack}}.csv"
            for eps in JOB_EPS
        ],
    wildcard_constraints:
        dataset="fmnist|cifar",
        arch="lr|fnn",
        clip="[0-9.e+-]+",
        init="fixed|g[0-9.e+-]+",
        attack="mi|backdoor|clipbkd",
    params:
        spec=lambda wc: quoted_json(train_spec(JAG, wc.dataset, JOB_EPS)),
        eps=" ".join(JOB_EPS),
        keep=TRAINED_DIR,
        seed=config["seed"],
        device=JAG["device"],
        models_per_call=JAG["models_per_call"],
        init_file=lambda wc, input: f"--init-file {input.init}" if wc.init == "fixed" else "",
    threads: 2
    resources:
        gpu=GPU_PER_JOB,
    log:
        "logs/jagielski_train/{dataset}_{arch}_c{clip}_{init}_{attack}.log",
    conda:
        ENV
    shell:
        "dpaudit jagielski-train --task {input.task} --dataset {wildcards.dataset}"
        " --arch {wildcards.arch} --attack {wildcards.attack} --clip {wildcards.clip}"
        " --init {wildcards.init} --eps {params.eps} {params.init_file}"
        " --device {params.device} --models-per-call {params.models_per_call}"
        " --keep-dir {params.keep} --spec {params.spec} --seed {params.seed}"
        " --out {output} 2> {log}"


AUDIT_SPEC = quoted_json({k: JAG[k] for k in AUDIT_KEYS})


rule jagielski_fig2_table:
    input:
        FIG2_CELLS,
    output:
        "results/jagielski_fig2.csv",
    params:
        spec=AUDIT_SPEC,
        seed=config["seed"],
    localrule: True
    log:
        "logs/jagielski_fig2_table.log",
    conda:
        ENV
    shell:
        "dpaudit jagielski-audit --experiment fig2 --scores {input} --spec {params.spec}"
        " --seed {params.seed} --out {output} 2> {log}"


rule jagielski_table2_table:
    input:
        TABLE2_CELLS,
    output:
        csv="results/jagielski_table2.csv",
        md="results/jagielski_table2.md",
    params:
        spec=AUDIT_SPEC,
        seed=config["seed"],
    localrule: True
    log:
        "logs/jagielski_table2_table.log",
    conda:
        ENV
    shell:
        "dpaudit jagielski-audit --experiment table2 --scores {input} --spec {params.spec}"
        " --seed {params.seed} --out {output.csv} --md {output.md} 2> {log}"


rule jagielski_plot:
    input:
        "results/jagielski_{experiment}.csv",
    output:
        pdf="figures/jagielski_{experiment}.pdf",
        png=report(
            "figures/jagielski_{experiment}.png",
            caption="../report/jagielski.rst",
            category="Jagielski et al. 2020",
            subcategory="{experiment}",
        ),
    wildcard_constraints:
        experiment="fig2|table2",
    localrule: True
    log:
        "logs/jagielski_plot_{experiment}.log",
    conda:
        ENV
    shell:
        "dpaudit jagielski-plot --experiment {wildcards.experiment} --table {input}"
        " --out {output.pdf} 2> {log}"


# Table 2 as a table in the report (which shows HTML, not Markdown).
rule jagielski_table2_html:
    input:
        "results/jagielski_table2.md",
    output:
        report(
            "results/jagielski_table2.html",
            caption="../report/jagielski_table2_table.rst",
            category="Jagielski et al. 2020",
            subcategory="table2",
        ),
    localrule: True
    log:
        "logs/jagielski_table2_html.log",
    conda:
        ENV
    shell:
        "dpaudit md-html --md {input} --out {output} 2> {log}"


# Named targets: `snakemake jagielski_fig2` / `jagielski_table2`.
rule jagielski_fig2:
    input:
        "figures/jagielski_fig2.pdf",


rule jagielski_table2:
    input:
        "figures/jagielski_table2.pdf",
        "results/jagielski_table2.html",
