# Private ridge regression (DA 5001/6400 HW3, section 1): one-run audits of output perturbation.
FIGURES.append("figures/ridge_audit.pdf")


rule ridge_audit:
    output:
        "results/ridge_audit.csv",
    params:
        spec=spec("ridge"),
        seed=config["seed"],
    resources:
        **job(mem_mb=2000, cpu_s=30),
    log:
        "logs/ridge_audit.log",
    conda:
        ENV
    shell:
        "logged {log} dpaudit ridge-audit --spec {params.spec} --seed {params.seed} --out {output}"


rule ridge_plot:
    input:
        "results/ridge_audit.csv",
    output:
        pdf="figures/ridge_audit.pdf",
        png=report(
            "figures/ridge_audit.png",
            caption="../report/ridge_audit.rst",
            category="HW3 - private ridge regression",
            subcategory="eps_LB against eps",
        ),
    localrule: True
    log:
        "logs/ridge_plot.log",
    conda:
        ENV
    shell:
        "dpaudit ridge-plot --table {input} --out {output.pdf} 2> {log}"
