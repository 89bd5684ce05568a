# The shuffling gap (docs/shuffle.md): the white-box audit of DP-SGD that shuffles its
# batches but reports Poisson accounting ("shuffle", "shuffle-once"), beside correct Poisson
# DP-SGD ("fixed"), on FMNIST at config `shuffle.settings`.  Named target `shuffle`; not in
# the default target.
from dpaudit.cli.shuffle import SPEC_KEYS as SHUFFLE_KEYS
from dpaudit.experiments.shuffle_settings import trains

SHUFFLE = config["shuffle"]


rule shuffle_audit:
    input:
        "results/jagielski/task_fmnist.npz",
    output:
        "results/shuffle_audit.csv",
    params:
        spec=quoted_json({k: SHUFFLE[k] for k in SHUFFLE_KEYS}),
        seed=config["seed"],
        device=job_device(SHUFFLE["device"]),
        # Kept batches of runs: a rerun (a timed-out cluster job) trains only the rest.
        store="results/shuffle/trained",
    threads: 2
    resources:
        # Model-steps (both sides, every subject and mates): 2 CPU cores, one thread,
        # measured with the full config (770 s for 8.6 M); one H100 not measured, a
        # projection from the tight white box's rate (docs/scale.md, "Job sizes").
        **job(
            mem_mb=2000,
            cpu_s=9e-5,
            gpu_s=1e-6,
            per=lambda wc: 2
            * len(SHUFFLE["mates"])
            * sum(
                s.get("runs", SHUFFLE["runs"])
                * s["steps_per_epoch"]
                * s["epochs"]
                * len([x for x in SHUFFLE["subjects"] if trains(x, s["epochs"])])
                for s in SHUFFLE["settings"]
            ),
        ),
    log:
        "logs/shuffle_audit.log",
    conda:
        ENV
    shell:
        "logged {log} dpaudit shuffle-audit --task {input} --spec {params.spec}"
        " --device {params.device} --seed {params.seed} --out {output} --store {params.store}"


rule shuffle_plot:
    input:
        "results/shuffle_audit.csv",
    output:
        pdf="figures/shuffle_audit.pdf",
        png=report(
            "figures/shuffle_audit.png",
            caption="../report/shuffle_audit.rst",
            category="Shuffled batches under Poisson accounting",
            subcategory="FMNIST, white box",
        ),
    localrule: True
    log:
        "logs/shuffle_plot.log",
    conda:
        ENV
    shell:
        "dpaudit shuffle-plot --table {input} --out {output.pdf} 2> {log}"


# Named target: `snakemake shuffle`.
rule shuffle:
    input:
        "figures/shuffle_audit.pdf",
        "results/shuffle_audit.csv",


# The full config's table measured on 2 CPU cores (config `reference_dir`,
# reference/README.md), drawn on any CPU without training or data:
# `snakemake --cores 1 shuffle_reference`.
use rule shuffle_plot as shuffle_reference_plot with:
    input:
        os.path.join(REFERENCE, "shuffle_audit.csv"),
    output:
        pdf="figures/reference/shuffle_audit.pdf",
        png="figures/reference/shuffle_audit.png",
    log:
        "logs/shuffle_reference_plot.log",


rule shuffle_reference:
    input:
        "figures/reference/shuffle_audit.pdf",
