# The image data sets, fetched once before any job reads them: one job per data set
# downloads it (or, offline, finds and checks the local copy), so training jobs that
# start together never download the same files side by side.  Runs on the submitting
# host under a cluster executor (compute nodes often have no internet).


rule data:
    output:
        "results/data/{dataset}.csv",
    wildcard_constraints:
        dataset="fmnist|mnist|cifar",
    params:
        data=spec("data"),
    localrule: True
    log:
        "logs/data_{dataset}.log",
    conda:
        ENV
    shell:
        "dpaudit data --dataset {wildcards.dataset} --data {params.data} --out {output}"
        " 2> {log}"
