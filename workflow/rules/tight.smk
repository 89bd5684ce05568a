# Tight audits of DP-SGD (docs/tight.md): the white-box multi-run audit (Nasr et al. 2023)
# on the FMNIST cells of Jagielski et al.'s Figure 2, the worst-case-init black-box audit
# (Annamalai and De Cristofaro 2024, full batch) on the same task, and the last-iterate
# heuristic (Steinke et al. 2025) beside them; the table also takes the FMNIST ClipBKD
# cells of Figure 2 and the one-run white-box audit at the same models and eps labels,
# where their configs have them.  Named target `tight`; not in the default target (1000
# runs per side and cell are hours of training).
from dpaudit.cli import fmnist_train
from dpaudit.cli.tight import BLACKBOX_SHARED as TIGHT_BLACKBOX_KEYS
from dpaudit.cli.tight import SPEC_KEYS as TIGHT_WHITEBOX_KEYS

TIGHT = config["tight"]
TIGHT_FMNIST = config["jagielski"]["datasets"]["fmnist"]
# Each eps label's noise: the Figure 2 table where it has the label, else tight.noise.
TIGHT_NOISE = {**TIGHT["noise"], **TIGHT_FMNIST["noise"]}


rule tight_whitebox:
    input:
        "results/jagielski/task_fmnist.npz",
    output:
        "results/tight/whitebox.csv",
    params:
        spec=quoted_json({k: TIGHT[k] for k in TIGHT_WHITEBOX_KEYS}),
        train=quoted_json(
            fmnist_train(config["jagielski"], {e: TIGHT_NOISE[e] for e in TIGHT["eps"]})
        ),
        seed=config["seed"],
        device=job_device(TIGHT["device"]),
        # Kept batches of runs: a rerun (a timed-out cluster job) trains only the rest.
        store="results/tight/trained/whitebox",
    threads: 2
    resources:
        # Models (both sides) x epochs: 2 CPU cores, measured with the full config (4,058 s
        # for 480,000); one H100, projected from Figure 2's measured model-steps/s, not
        # measured (docs/scale.md, "Job sizes"; a job past its limit resumes from its kept
        # blocks).
        **job(
            mem_mb=2000,
            cpu_s=8.5e-3,
            gpu_s=5e-5,
            per=lambda wc: 2
            * TIGHT["runs"]
            * len(TIGHT["archs"])
            * len(TIGHT["eps"])
            * TIGHT_FMNIST["epochs"],
        ),
    log:
        "logs/tight_whitebox.log",
    conda:
        ENV
    shell:
        "logged {log} dpaudit tight-whitebox-audit --task {input} --spec {params.spec}"
        " --train {params.train} --device {params.device} --seed {params.seed} --out {output}"
        " --store {params.store}"


rule tight_blackbox:
    input:
        "results/jagielski/task_fmnist.npz",
    output:
        "results/tight/blackbox.csv",
    params:
        spec=quoted_json(
            {
                **{k: TIGHT[k] for k in TIGHT_BLACKBOX_KEYS},
                **TIGHT["blackbox"],
                "hidden": TIGHT_FMNIST["hidden"],
            }
        ),
        seed=config["seed"],
        device=job_device(TIGHT["device"]),
        store="results/tight/trained/blackbox",
    threads: 2
    resources:
        # Models (both sides, every init) x full-batch steps, as above (2 CPU cores: 2,193 s
        # for 4 M with the full config, the worst-case inits' pre-training included).
        **job(
            mem_mb=3000,
            cpu_s=5.5e-4,
            gpu_s=1e-5,
            per=lambda wc: 2
            * TIGHT["runs"]
            * len(TIGHT["blackbox"]["inits"])
            * len(TIGHT["archs"])
            * len(TIGHT["eps"])
            * TIGHT["blackbox"]["steps"],
        ),
    log:
        "logs/tight_blackbox.log",
    conda:
        ENV
    shell:
        "logged {log} dpaudit tight-blackbox-audit --task {input} --spec {params.spec}"
        " --device {params.device} --seed {params.seed} --out {output}"
        " --store {params.store}"


rule tight_table:
    input:
        whitebox="results/tight/whitebox.csv",
        blackbox="results/tight/blackbox.csv",
        # Their rows at the tight archs x eps labels that jagielski.fig2 and onerun have.
        clipbkd="results/jagielski_fig2.csv",
        onerun="results/onerun_dpsgd.csv",
    output:
        "results/tight_audit.csv",
    localrule: True
    log:
        "logs/tight_table.log",
    conda:
        ENV
    shell:
        "dpaudit tight-table --whitebox {input.whitebox} --blackbox {input.blackbox}"
        " --clipbkd {input.clipbkd} --onerun {input.onerun} --out {output} 2> {log}"


rule tight_plot:
    input:
        "results/tight_audit.csv",
    output:
        pdf="figures/tight_audit.pdf",
        png=report(
            "figures/tight_audit.png",
            caption="../report/tight_audit.rst",
            category="Tight audits of DP-SGD",
            subcategory="FMNIST, white box and black box",
        ),
    localrule: True
    log:
        "logs/tight_plot.log",
    conda:
        ENV
    shell:
        "dpaudit tight-plot --table {input} --out {output.pdf} 2> {log}"


# Named target: `snakemake tight`.
rule tight:
    input:
        "figures/tight_audit.pdf",
        "results/tight_audit.csv",


# The full config's tight table measured on 2 CPU cores (config `reference_dir`,
# reference/README.md), with the ClipBKD rows of the paper-scale Figure 2 table, drawn on
# any CPU without training or data: `snakemake --cores 1 tight_reference`.
rule tight_reference_table:
    input:
        whitebox=os.path.join(REFERENCE, "tight_whitebox.csv"),
        blackbox=os.path.join(REFERENCE, "tight_blackbox.csv"),
        clipbkd=os.path.join(REFERENCE, "jagielski_fig2.csv"),
    output:
        "results/reference/tight_audit.csv",
    localrule: True
    log:
        "logs/tight_reference_table.log",
    conda:
        ENV
    shell:
        "dpaudit tight-table --whitebox {input.whitebox} --blackbox {input.blackbox}"
        " --clipbkd {input.clipbkd} --out {output} 2> {log}"


use rule tight_plot as tight_reference_plot with:
    input:
        "results/reference/tight_audit.csv",
    output:
        pdf="figures/reference/tight_audit.pdf",
        png="figures/reference/tight_audit.png",
    log:
        "logs/tight_reference_plot.log",


rule tight_reference:
    input:
        "figures/reference/tight_audit.pdf",
        "results/reference/tight_audit.csv",
