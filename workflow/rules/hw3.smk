# HW3 Q2 (DA 5001/6400 HW3, IIT Madras 2024, section 2): one-run audits of the Gaussian
# sum mechanism, one job per grid.
HW3_GRIDS = ["eps", "m", "d"]
FIGURES.extend(f"figures/hw3_eps_vs_{grid}.pdf" for grid in HW3_GRIDS)


rule hw3_audit:
    output:
        "results/hw3_eps_vs_{grid}.csv",
    wildcard_constraints:
        grid="eps|m|d",
    params:
        spec=spec("hw3"),
        seed=config["seed"],
    threads: 2
    resources:
        **job(mem_mb=2000, cpu_s=2.5e-8, per=lambda wc: hw3_draws(config["hw3"], wc.grid)),
    log:
        "logs/hw3_audit_{grid}.log",
    conda:
        ENV
    shell:
        "logged {log} dpaudit hw3-audit --grid {wildcards.grid} --spec {params.spec}"
        " --seed {params.seed} --threads {threads} --out {output}"


rule hw3_plot:
    input:
        "results/hw3_eps_vs_{grid}.csv",
    output:
        pdf="figures/hw3_eps_vs_{grid}.pdf",
        png=report(
            "figures/hw3_eps_vs_{grid}.png",
            caption="../report/hw3.rst",
            category="HW3 - Gaussian sum, one run",
            subcategory="eps_LB against {grid}",
        ),
    wildcard_constraints:
        grid="eps|m|d",
    localrule: True
    log:
        "logs/hw3_plot_{grid}.log",
    conda:
        ENV
    shell:
        "dpaudit hw3-plot --grid {wildcards.grid} --table {input} --out {output.pdf} 2> {log}"


# Named targets: `snakemake hw3_eps` etc. regenerate one figure and its table.
rule hw3_eps:
    input:
        "figures/hw3_eps_vs_eps.pdf",


rule hw3_m:
    input:
        "figures/hw3_eps_vs_m.pdf",


rule hw3_d:
    input:
        "figures/hw3_eps_vs_d.pdf",
