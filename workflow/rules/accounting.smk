# Accountant and composition curves: Abadi et al. Fig. 2 and the composition graph of
# the CSCI 699 Week 4 lecture notes.  Deterministic and CPU-only: one job per table.
FIGURES += ["figures/abadi_fig2.pdf", "figures/composition.pdf"]


rule accounting_abadi:
    output:
        "results/abadi_fig2.csv",
    params:
        spec=spec("accounting", "abadi"),
        seed=config["seed"],
    resources:
        **job(mem_mb=2000, cpu_s=60),
    log:
        "logs/accounting_abadi.log",
    conda:
        ENV
    shell:
        "logged {log} dpaudit accounting-curves --figure abadi --spec {params.spec}"
        " --seed {params.seed} --out {output}"


rule accounting_abadi_plot:
    input:
        "results/abadi_fig2.csv",
    output:
        pdf="figures/abadi_fig2.pdf",
        png=report(
            "figures/abadi_fig2.png",
            caption="../report/abadi_fig2.rst",
            category="Abadi et al. 2016",
            subcategory="fig2",
        ),
    localrule: True
    log:
        "logs/accounting_abadi_plot.log",
    conda:
        ENV
    shell:
        "dpaudit accounting-plot --figure abadi --table {input} --out {output.pdf} 2> {log}"


rule accounting_composition:
    output:
        "results/composition.csv",
    params:
        spec=spec("accounting", "composition"),
        seed=config["seed"],
    resources:
        **job(mem_mb=2000, cpu_s=60),
    log:
        "logs/accounting_composition.log",
    conda:
        ENV
    shell:
        "logged {log} dpaudit accounting-curves --figure composition --spec {params.spec}"
        " --seed {params.seed} --out {output}"


rule accounting_composition_plot:
    input:
        "results/composition.csv",
    output:
        pdf="figures/composition.pdf",
        png=report(
            "figures/composition.png",
            caption="../report/composition.rst",
            category="Accountants",
            subcategory="Composition",
        ),
    localrule: True
    log:
        "logs/accounting_composition_plot.log",
    conda:
        ENV
    shell:
        "dpaudit accounting-plot --figure composition --table {input} --out {output.pdf}"
        " 2> {log}"
