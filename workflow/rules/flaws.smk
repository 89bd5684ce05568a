# The flaws table (docs/flaws.md): each flaw found in real DP-SGD code through the checks
# that see it (the measured-parameters check of an Opacus training, the sequential audit
# of dpaudit's trainer), beside its fix, on random data.  Named target `flaws`; not in the
# default target.
FLAWS = config["flaws"]


rule flaws_audit:
    output:
        "results/flaws_audit.csv",
    params:
        only=" ".join(f"--flaw {shlex.quote(f)}" for f in FLAWS["only"]),
        scale=FLAWS["scale"],
        alpha=FLAWS["alpha"],
        seed=config["seed"],
    threads: 1
    resources:
        # CPU seconds of the whole table on 2 loaded cores, measured at scale full (the
        # reference table) and quick.
        **job(mem_mb=2000, cpu_s={"full": 900, "quick": 120}[FLAWS["scale"]]),
    log:
        "logs/flaws_audit.log",
    conda:
        ENV
    shell:
        "logged {log} dpaudit flaws --scale {params.scale} --alpha {params.alpha}"
        " {params.only} --seed {params.seed} --out {output}"


rule flaws_plot:
    input:
        "results/flaws_audit.csv",
    output:
        pdf="figures/flaws_audit.pdf",
        png="figures/flaws_audit.png",
    localrule: True
    log:
        "logs/flaws_plot.log",
    conda:
        ENV
    shell:
        "dpaudit flaws-plot --table {input} --out {output.pdf} 2> {log}"


# Named target: `snakemake flaws`.
rule flaws:
    input:
        "figures/flaws_audit.pdf",
        "results/flaws_audit.csv",


# The kept table (reference/flaws_audit.csv), drawn without training:
# `snakemake --cores 1 flaws_reference`.
use rule flaws_plot as flaws_reference_plot with:
    input:
        os.path.join(REFERENCE, "flaws_audit.csv"),
    output:
        pdf="figures/reference/flaws_audit.pdf",
        png="figures/reference/flaws_audit.png",
    log:
        "logs/flaws_reference_plot.log",


rule flaws_reference:
    input:
        "figures/reference/flaws_audit.pdf",
