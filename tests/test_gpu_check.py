"""benchmarks/gpu_check.sh, the one command of a GPU session: its ``--dry-run`` (the same
stages on the CPU at tiny scale, under ``DPAUDIT_FORCE_GPU`` where dpaudit knows it), a
stage that fails or hangs (the ``GPU_CHECK_FAIL`` hook), the commands it would run on a
GPU (``--plan``), and its config overlays."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
STAGES = ["env", "cuda_tests", "bench_dpsgd", "bench_step", "tramer", "tight", "all"]
FILES = {"summary.txt", "timings.tsv", "stages.log", "gpu_samples.csv", "results.tar.gz"}
#: What the device tool brings back from $OUT: 8 files of at most 16 MiB.
MAX_FILES, MAX_BYTES = 8, 16 * 2**20


def gpu_check(out: Path, *args: str, env: dict | None = None, timeout: float = 300):
    """``bash benchmarks/gpu_check.sh OUT ARGS...`` with this Python (and its dpaudit and
    snakemake) and no test hook unless ``env`` sets one."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPU_CHECK_")}
    base.update(PYTHON=sys.executable,
                PATH=os.pathsep.join([str(Path(sys.executable).parent), base.get("PATH", "")]))
    return subprocess.run(["bash", str(SCRIPT), str(out), *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout, env={**base, **(env or {})})


def timings(out: Path) -> dict[str, dict]:
    with open(out / "timings.tsv", newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    assert [r["stage"] for r in rows] == STAGES, rows
    return {r["stage"]: r for r in rows}


def final_table(stdout: str) -> dict[str, list[str]]:
    """The table printed last: stage -> its columns (seconds, exit, status, ...)."""
    lines = stdout.rstrip().splitlines()
    header = max(i for i, line in enumerate(lines)
                 if line.split()[:3] == ["stage", "seconds", "exit"])
    table = lines[header + 1:]
    assert len(table) == len(STAGES), f"the output does not end with the table:\n{stdout[-3000:]}"
    return {line.split()[0]: line.split()[1:] for line in table}


def leftover_processes(marker: str) -> list[str]:
    """Command lines of running processes that name ``marker``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in text:
            found.append(text)
    return found


def check_layout(out: Path) -> None:
    entries = list(out.iterdir())
    assert {p.name for p in entries} == FILES
    assert len(entries) <= MAX_FILES and all(p.is_file() for p in entries)  # flat
    assert all(p.stat().st_size <= MAX_BYTES for p in entries)


#: The dry run's default budget (seconds).
DRY_BUDGET = 400


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check") / "out"
    start = time.monotonic()
    # bench_dpsgd.py --cuda-only --tiny, the stage's command, is run under a forced GPU by
    # tests/test_gpu_branches.py (with less memory, so that K is sized): a stub here
    proc = gpu_check(out, "--dry-run", env={"GPU_CHECK_FAIL": "bench_dpsgd=0"}, timeout=600)
    return SimpleNamespace(out=out, proc=proc, seconds=time.monotonic() - start)


@pytest.mark.slow
class TestDryRun:
    """One dry run with the default budget (the benchmark of the groups a stub), read by
    every test of the class."""

    def test_exits_0_with_every_stage_in_the_final_table(self, dry_run):
        proc = dry_run.proc
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
        table = final_table(proc.stdout)
        assert list(table) == STAGES
        for stage, (seconds, code, status, *_) in table.items():
            float(seconds)
            assert status in {"ok", "skip", "budget"}, (stage, status, proc.stdout[-3000:])
            assert code == {"ok": "0", "skip": "-", "budget": "124"}[status], (stage, code)
        # the stages that need no other engineer's file ran for real
        for stage in ("env", "cuda_tests", "bench_dpsgd", "bench_step", "tramer", "tight"):
            assert table[stage][2] == "ok", stage
        assert table["all"][2] in {"ok", "budget"}

    def test_outdir_is_flat_small_and_complete(self, dry_run):
        check_layout(dry_run.out)
        with tarfile.open(dry_run.out / "results.tar.gz") as tar:
            names = set(tar.getnames())
        for table in ("results/tramer_audit.csv", "results/tight/whitebox.csv",
                      "results/tight/blackbox.csv"):
            assert table in names, sorted(names)
        assert any(n.startswith("logs/") for n in names)
        # no nvidia-smi here: the samples file is its header alone
        assert (dry_run.out / "gpu_samples.csv").read_text().startswith("timestamp,")

    def test_timings_hold_a_number_for_each_stage(self, dry_run):
        rows = timings(dry_run.out)
        for stage, row in rows.items():
            seconds = float(row["seconds"])
            assert seconds >= 0
            assert row["exit"] == "-" or int(row["exit"]) >= 0
        assert rows["tramer"]["status"] == "ok" and float(rows["tramer"]["seconds"]) > 0
        assert sum(float(r["seconds"]) for r in rows.values()) <= DRY_BUDGET
        assert dry_run.seconds < DRY_BUDGET

    def test_each_stage_ran_its_command_and_logged_it(self, dry_run):
        log = (dry_run.out / "stages.log").read_text()
        assert "[in place of: " in log  # the stubbed stage names its command
        for text in ("tests/test_cuda.py", "benchmarks/bench_dpsgd.py --cuda-only --tiny",
                     "benchmarks/bench_step.py --device cuda --tiny --threads 1",
                     "operations per step (this, tramer, CPU): K=1",
                     "results/tramer_audit.csv", "results/tight/whitebox.csv",
                     "results/tight/blackbox.csv", "config/gpu_check_tight.yaml",
                     "config/gpu_check_dry.yaml", "torch "):
            assert text in log, text
        if "DPAUDIT_FORCE_GPU" in (ROOT / "src/dpaudit/device.py").read_text():
            assert 'DPAUDIT_FORCE_GPU={"name": "NVIDIA H100 80GB HBM3"' in log

    def test_the_dry_overlay_sets_the_tight_runs_and_the_data_is_tiny(self, dry_run,
                                                                     tmp_path):
        from dpaudit.io import read_table

        with tarfile.open(dry_run.out / "results.tar.gz") as tar:
            tar.extractall(tmp_path, filter="data")
        for audit in ("whitebox", "blackbox"):
            _, meta = read_table(tmp_path / "results" / "tight" / f"{audit}.csv")
            assert meta["spec"]["runs"] == 6 and meta["spec"]["archs"] == ["lr"]
        _, meta = read_table(tmp_path / "results" / "tramer_audit.csv")
        assert meta["spec"]["runs"] == 40


def test_a_failed_and_a_hung_stage_are_recorded_and_the_script_goes_on(tmp_path):
    out = tmp_path / "out"
    start = time.monotonic()
    proc = gpu_check(out, "--dry-run", "--stages", "env,cuda_tests", "--budget", "25",
                     env={"GPU_CHECK_FAIL": "env=5,cuda_tests=hang"}, timeout=120)
    seconds = time.monotonic() - start
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert seconds < 30  # the hung stage is stopped at its limit, within the budget
    rows = timings(out)
    assert (rows["env"]["exit"], rows["env"]["status"]) == ("5", "FAILED")
    assert "GPU_CHECK_FAIL=5" in rows["env"]["note"]
    # the next stage still started: it hung and was stopped at its limit
    hung = rows["cuda_tests"]
    assert (hung["exit"], hung["status"]) == ("124", "TIMEOUT")
    assert 0 < float(hung["seconds"]) <= int(hung["limit_s"]) + 5
    for stage in STAGES[2:]:
        assert (rows[stage]["status"], float(rows[stage]["seconds"])) == ("skip", 0.0)
    table = final_table(proc.stdout)
    assert table["env"][1:3] == ["5", "FAILED"] and table["cuda_tests"][1:3] == ["124", "TIMEOUT"]
    check_layout(out)
    log = (out / "stages.log").read_text()
    assert "GPU_CHECK_FAIL: exits 5" in log and "GPU_CHECK_FAIL: hangs" in log
    assert not leftover_processes(str(out)), "the hung stage's process is still running"


def test_the_gpu_run_runs_the_commands_of_a_gpu_session(tmp_path):
    """Without --dry-run (--plan: print, run nothing): the CUDA tests, the benchmark on
    CUDA, the full config's Tramer et al. audit and tight tables at 10,000 runs, then the
    whole DAG, all with the offline data overlay, in the checkout."""
    offline = tmp_path / "offline.yaml"
    offline.write_text("data: {root: /nowhere, download: false}\n")
    proc = gpu_check(tmp_path / "out", "--plan", env={"GPU_CHECK_OFFLINE": str(offline)})
    assert proc.returncode == 0, proc.stderr
    plan = {line.split(":")[1].strip(): line for line in proc.stdout.splitlines()
            if line.startswith("== gpu_check: ")}
    assert list(plan) == STAGES
    assert "-m pytest tests/test_cuda.py" in plan["cuda_tests"]
    assert plan["bench_dpsgd"].endswith("benchmarks/bench_dpsgd.py --cuda-only --skip-levers")
    assert "--tiny" not in plan["bench_step"] and "--device cuda" in plan["bench_step"]
    config = f"--configfile {ROOT}/config/config.yaml {offline}"
    snake = f"-m snakemake -s {ROOT}/Snakefile --directory {ROOT} --cores all"
    assert snake in plan["tramer"] and plan["tramer"].endswith(
        f"results/tramer_audit.csv {config}")
    assert snake in plan["tight"] and plan["tight"].endswith(
        f"results/tight/whitebox.csv results/tight/blackbox.csv {config} "
        f"{ROOT}/config/gpu_check_tight.yaml")
    assert snake in plan["all"] and plan["all"].endswith(config)
    rows = timings(tmp_path / "out")
    assert {r["status"] for r in rows.values()} <= {"plan", "skip"}
    limits = [int(r["limit_s"]) for r in rows.values() if r["status"] == "plan"]
    assert sum(limits) > 520 and max(limits) < 520  # each a share of what is left
    check_layout(tmp_path / "out")


FAKE_NVIDIA_SMI = """#!/usr/bin/env bash
# a stand-in for nvidia-smi: the sampler's lines every 0.2 s, the GPU's name, a table
case "$*" in
  *"-l 1"*)
    trap 'exit 0' TERM
    echo "timestamp, utilization.gpu [%], memory.used [MiB]"
    u=0
    while :; do
      u=$((u + 1))
      echo "2026/11/27 12:00:00.000, $((u * 10 % 100)) %, $((1000 + u)) MiB"
      sleep 0.2
    done ;;
  *--query-gpu=name*) echo "NVIDIA H100 80GB HBM3, 81559 MiB, 580.95.05" ;;
  *) echo "+ a fake nvidia-smi table +" ;;
esac
"""


def test_the_gpu_run_samples_the_gpu_and_stops_the_sampler(tmp_path):
    """Without --dry-run, where nvidia-smi answers (a stand-in here): its GPU named in the
    table, the 1 s sampler's lines kept, each stage's peaks from them, the sampler stopped;
    every stage but env a stub (GPU_CHECK_FAIL=STAGE=0)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text(FAKE_NVIDIA_SMI)
    fake.chmod(0o755)
    offline = tmp_path / "offline.yaml"
    offline.write_text("data: {root: /nowhere, download: false}\n")
    out = tmp_path / "out"
    stubs = ",".join(f"{stage}=0" for stage in STAGES[1:])
    proc = gpu_check(out, "--budget", "60", env={
        "PATH": f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}"
                f"{os.environ['PATH']}",
        "GPU_CHECK_FAIL": stubs, "GPU_CHECK_OFFLINE": str(offline),
        "GPU_CHECK_WORKDIR": str(tmp_path / "work")}, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    rows = timings(out)
    assert rows["env"]["status"] == "ok" and "NVIDIA H100 80GB HBM3" in rows["env"]["note"]
    assert {r["status"] for r in rows.values()} == {"ok"}
    samples = (out / "gpu_samples.csv").read_text().splitlines()
    assert samples[0].startswith("timestamp, utilization.gpu") and len(samples) > 3
    assert 0 < int(rows["env"]["peak_util_pct"]) <= 100
    assert int(rows["env"]["peak_mem_mib"]) > 1000
    summary = (out / "summary.txt").read_text()
    assert "NVIDIA H100 80GB HBM3" in summary and "peak GPU utilisation - %" not in summary
    assert proc.stdout.rstrip().endswith(summary.rstrip())
    check_layout(out)
    time.sleep(0.5)  # the sampler's last `sleep 0.2`
    assert not leftover_processes(str(fake)), "the nvidia-smi sampler is still running"


@pytest.mark.parametrize("args,words", [
    ([], "name the output folder"),
    (["OUT", "--budget", "0"], "--budget 0"),
    (["OUT", "--budget", "ten"], "--budget ten"),
    (["OUT", "--stages", "env,bogus"], "no stage 'bogus'"),
    (["OUT", "--bogus"], "unknown option --bogus"),
])
def test_usage_errors_exit_2_naming_the_problem(tmp_path, args, words):
    args = [str(tmp_path / a) if a == "OUT" else a for a in args]
    proc = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 2 and words in proc.stderr, proc.stderr


def _merged(*names: str) -> dict:
    def merge(base, overlay):
        out = dict(base)
        for key, value in overlay.items():
            out[key] = (merge(out[key], value) if isinstance(value, dict)
                        and isinstance(out.get(key), dict) else value)
        return out

    cfg: dict = {}
    for name in names:
        cfg = merge(cfg, yaml.safe_load((ROOT / "config" / name).read_text()))
    return cfg


def test_the_overlays_validate_and_set_what_the_stages_need():
    import jsonschema

    from dpaudit.experiments.checks import problems

    schema = yaml.safe_load((ROOT / "src" / "dpaudit" / "schema.yaml").read_text())
    gpu = _merged("config.yaml", "gpu_check_tight.yaml")
    full = _merged("config.yaml")
    assert gpu["tight"]["runs"] == 10_000
    assert {k: v for k, v in gpu["tight"].items() if k != "runs"} == {
        k: v for k, v in full["tight"].items() if k != "runs"}  # both archs, every label
    dry = _merged("config.yaml", "quick.yaml", "gpu_check_tight.yaml", "gpu_check_dry.yaml")
    assert dry["tight"]["runs"] == 6  # the dry run's sizes win over the GPU's
    for cfg in (gpu, dry):
        jsonschema.validate(cfg, schema)
        assert not problems(cfg)


def test_the_tiny_data_names_cifars_classes_as_dpaudit_does():
    from fakedata import CIFAR10_CLASSES

    from dpaudit.data import CIFAR10_CLASSES as ours

    assert CIFAR10_CLASSES == tuple(ours)
