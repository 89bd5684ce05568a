"""Several training jobs on one GPU, with the CPU jobs beside them (one dry run of the
paper-scale DAG: what each job asks for and what it waits for)."""

from __future__ import annotations

import re

from test_conventions import _jobs
from test_workflow import load, snakemake

# The CPU jobs that need no training: they can run from the start, beside the training.
INDEPENDENT = {"hw3_audit", "ridge_audit", "accounting_abadi", "accounting_composition",
               "onerun_audit"}


def _field(block: str, name: str) -> list[str]:
    found = re.search(rf"^    {name}: (.*)$", block, re.M)
    return found.group(1).split(", ") if found else []


def test_cpu_jobs_run_beside_the_training_jobs_sharing_one_gpu(tmp_path):
    """One GPU shared by the config's jobs_per_gpu (4) training jobs, on 16 cores (an
    H100 machine; `--resources gpu=4` is what its run registers, 1 GPU x 4 places): each
    training job takes one place and 2 threads, so four at once leave 8 cores, and no CPU
    job asks for more than 2. HW3, ridge, the accountants and the one-run audits wait for
    no training job, so they run beside the training instead of after it."""
    assert load("config.yaml")["jobs_per_gpu"] == 4
    out = snakemake("-n", "--cores", "16", "--resources", "gpu=4", "--directory",
                    str(tmp_path))
    assert out.returncode == 0, out.stderr
    jobs = {}
    for _, rule, block in _jobs(out.stdout):
        resources = dict(r.split("=", 1) for r in _field(block, "resources"))
        threads = int((_field(block, "threads") or ["1"])[0])
        for output in _field(block, "output"):
            jobs[output] = (rule, threads, int(resources.get("gpu", 0)), _field(block, "input"))
    training = {o for o, (_, _, gpu, _) in jobs.items() if gpu}
    assert {jobs[o][0] for o in training} == {"jagielski_train", "jagielski_task",
                                               "tramer_audit", "abadi_features", "abadi_train"}
    assert {jobs[o][1] for o in training} == {2}
    after, grew = set(training), True
    while grew:  # every job that waits for a training job
        more = {o for o, (_, _, _, inputs) in jobs.items() if after & set(inputs)}
        grew = not more <= after
        after |= more
    beside = {o: jobs[o] for o in jobs if o not in after}
    assert INDEPENDENT <= {rule for rule, *_ in beside.values()}
    cores_left = 16 - 4 * 2
    assert max(threads for _, threads, _, _ in jobs.values()) <= cores_left
