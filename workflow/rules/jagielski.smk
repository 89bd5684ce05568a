# Jagielski et al. 2020: DP-SGD audits on FMNIST and CIFAR-10.  A cell is (data set,
# model, clip, init, eps, attack) and has its own score table.  One job trains every cell
# of one data set, model and attack (a group): a trial's seed fixes its batches and noise
# in all of them, so they train as the columns of one wide step.  Figure 2, Table 2 and
# the one-run comparison share cells.  Each job gets only the config values its cells
# depend on, and keeps each finished block of trials in TRAINED_DIR: when a job reruns
# (new cells, an interruption), it reuses what is kept and trains only the rest.
from dpaudit.experiments.jagielski import (
    AUDIT_KEYS,
    TASK_KEYS,
    TRAINED_DIR,
    cell_path,
    check_grid,
    grid_cells,
    group_dirs,
    groups,
    table_spec,
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
GROUPS = {"_".join(g): cells for g, cells in groups(GRID["all"]).items()}
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
        device=job_device(JAG["device"]),
    threads: 2
    resources:
        # CIFAR-10 pretrains its CNN (per image-epoch); FMNIST only reads the data.
        **job(
            mem_mb=3000,
            cpu_s=9.0e-3,
            gpu_s=7.5e-5,
            per=lambda wc: pretrain_image_epochs(JAG, wc.dataset),
            gpu=lambda wc: wc.dataset == "cifar",
        ),
    log:
        "logs/jagielski_task_{dataset}.log",
    conda:
        ENV
    shell:
        "logged {log} dpaudit jagielski-task --dataset {wildcards.dataset} --spec {params.spec}"
        " --data {params.data} --device {params.device} --seed {params.seed}"
        " --out {output}"


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
    resources:
        **job(mem_mb=2000, cpu_s=10),
    log:
        "logs/jagielski_init_{dataset}_{arch}.log",
    conda:
        ENV
    shell:
        "logged {log} dpaudit jagielski-init --dataset {wildcards.dataset} --arch {wildcards.arch}"
        " --task {input} --hidden {params.hidden} --seed {params.seed} --out {output}"


rule jagielski_train:
    input:
        task="results/jagielski/task_{dataset}.npz",
        init=lambda wc: (
            [f"results/jagielski/init_{wc.dataset}_{wc.arch}.pt"]
            if any(c[1] == "fixed" for c in GROUPS[f"{wc.dataset}_{wc.arch}_{wc.attack}"])
            else []
        ),
    output:
        directory("results/jagielski/scores/{dataset}_{arch}_{attack}"),
    wildcard_constraints:
        dataset="fmnist|cifar",
        arch="lr|fnn",
        attack="mi|backdoor|clipbkd",
    params:
        cells=lambda wc: quoted_json(GROUPS[f"{wc.dataset}_{wc.arch}_{wc.attack}"]),
        spec=lambda wc: quoted_json(
            train_spec(
                JAG,
                wc.dataset,
                sorted({c[2] for c in GROUPS[f"{wc.dataset}_{wc.arch}_{wc.attack}"]}),
            )
        ),
        store=lambda wc: f"{TRAINED_DIR}/{wc.dataset}_{wc.arch}_{wc.attack}",
        seed=config["seed"],
        device=job_device(JAG["device"]),
        block=JAG["block_trials"],
        init_file=lambda wc, input: f"--init-file {input.init}" if input.init else "",
    threads: 2
    resources:
        **job(
            mem_mb=2000,
            cpu_s=1.3e-2,
            gpu_s=1.0e-4,
            per=lambda wc: model_epochs(
                JAG, wc.dataset, wc.attack, len(GROUPS[f"{wc.dataset}_{wc.arch}_{wc.attack}"])
            ),
        ),
    log:
        "logs/jagielski_train/{dataset}_{arch}_{attack}.log",
    conda:
        ENV
    shell:
        "logged {log} dpaudit jagielski-train --task {input.task} --dataset {wildcards.dataset}"
        " --arch {wildcards.arch} --attack {wildcards.attack} --cells {params.cells}"
        " {params.init_file} --device {params.device} --block-trials {params.block}"
        " --store {params.store} --spec {params.spec} --seed {params.seed}"
        " --out-dir {output}"


AUDIT_SPEC = quoted_json({k: JAG[k] for k in AUDIT_KEYS})


rule jagielski_fig2_table:
    input:
        group_dirs(GRID["fig2"]),
    output:
        "results/jagielski_fig2.csv",
    params:
        scores=FIG2_CELLS,
        spec=quoted_json(table_spec(JAG, "fig2")),
        seed=config["seed"],
    localrule: True
    log:
        "logs/jagielski_fig2_table.log",
    conda:
        ENV
    shell:
        "dpaudit jagielski-audit --experiment fig2 --scores {params.scores} --spec {params.spec}"
        " --seed {params.seed} --out {output} 2> {log}"


rule jagielski_table2_table:
    input:
        group_dirs(GRID["table2"]),
    output:
        csv="results/jagielski_table2.csv",
        md="results/jagielski_table2.md",
    params:
        scores=TABLE2_CELLS,
        spec=quoted_json(table_spec(JAG, "table2")),
        seed=config["seed"],
    localrule: True
    log:
        "logs/jagielski_table2_table.log",
    conda:
        ENV
    shell:
        "dpaudit jagielski-audit --experiment table2 --scores {params.scores} --spec {params.spec}"
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
        md="results/jagielski_table2.md",
        table="results/jagielski_table2.csv",
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
        "dpaudit md-html --md {input.md} --table {input.table} --out {output} 2> {log}"


# Named targets: `snakemake jagielski_fig2` / `jagielski_table2`.
rule jagielski_fig2:
    input:
        "figures/jagielski_fig2.pdf",


rule jagielski_table2:
    input:
        "figures/jagielski_table2.pdf",
        "results/jagielski_table2.html",


# The reference tables of a paper-scale GPU run (config `reference_dir`,
# reference/README.md) drawn and tabulated on any CPU, without training or data:
# `snakemake --cores 1 jagielski_reference`.
REFERENCE = os.path.join(workflow.basedir, config["reference_dir"])  # keeps an absolute path


use rule jagielski_plot as jagielski_reference_plot with:
    input:
        os.path.join(REFERENCE, "jagielski_{experiment}.csv"),
    output:
        pdf="figures/reference/jagielski_{experiment}.pdf",
        png="figures/reference/jagielski_{experiment}.png",
    log:
        "logs/jagielski_reference_plot_{experiment}.log",


rule jagielski_reference_md:
    input:
        os.path.join(REFERENCE, "jagielski_table2.csv"),
    output:
        "results/reference/jagielski_table2.md",
    localrule: True
    log:
        "logs/jagielski_reference_md.log",
    conda:
        ENV
    shell:
        "dpaudit jagielski-md --table {input} --out {output} 2> {log}"


rule jagielski_reference:
    input:
        "figures/reference/jagielski_fig2.pdf",
        "figures/reference/jagielski_table2.pdf",
        "results/reference/jagielski_table2.md",
