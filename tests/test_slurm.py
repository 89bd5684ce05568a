"""Cluster jobs: what each job asks for (a GPU, a time limit, memory, the partition), the
SLURM profiles, the sbatch line the installed executor plugin builds, failed logs kept,
the `dpaudit` the jobs call, and a run on a real one-node SLURM against a local run.

The plugin is an extra (`pip install -e ".[slurm]"`): the tests that need it skip without
it. The real run needs root and Debian's SLURM and munge (.ci/run installs them).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest
import yaml

from dpaudit.io import read_table
from test_conventions import _jobs
from test_workflow import ROOT, _fake_image_data, _tiny_config, load, snakemake, write_config

PLUGIN = "snakemake_executor_plugin_slurm"
NO_PLUGIN = 'the SLURM executor plugin is not installed (pip install -e ".[slurm]")'
PROFILES = ("slurm", "slurm-cpu")
# Jobs that train on a GPU where the run has GPUs; FMNIST's task only reads data and the
# one-run audit is no faster on a GPU, so they are CPU jobs.
GPU_RULES = ("jagielski_task", "jagielski_train", "tramer_audit", "abadi_features",
             "abadi_train")
# Aggregation and plotting: run on the submitting host, never as cluster jobs.
LOCAL_RULES = ("data", "jagielski_fig2_table", "jagielski_table2_table",
               "jagielski_table2_html", "jagielski_plot", "onerun_many_model", "onerun_plot",
               "tramer_plot", "hw3_plot", "ridge_plot", "accounting_abadi_plot",
               "accounting_composition_plot", "trials_needed_table", "trials_needed_plot",
               "jagielski_reference_md", "tramer_reference_plot", "abadi_table",
               "abadi_plot", "tight_table", "tight_plot", "tight_reference_table",
               "shuffle_plot", "flaws_plot")
# Seconds each job (named by its first output) took in the paper-scale run on the H100
# machine (docs/scale.md, "Job sizes": the snakemake logs of that run) and in the quick
# run on 2 CPU cores.
SCORES = "results/jagielski/scores/"
H100_S = {"results/jagielski/task_fmnist.npz": 14, "results/jagielski/task_cifar.npz": 59,
          "results/jagielski/init_fmnist_fnn.pt": 8, SCORES + "fmnist_fnn_clipbkd": 243,
          SCORES + "fmnist_fnn_backdoor": 56, SCORES + "cifar_fnn_clipbkd": 46,
          SCORES + "cifar_fnn_mi": 23, "results/tramer_audit.csv": 172,
          "results/onerun_dpsgd.csv": 76, "results/hw3_eps_vs_m.csv": 84,
          "results/hw3_eps_vs_d.csv": 50, "results/ridge_audit.csv": 25,
          "results/composition.csv": 40}
QUICK_CPU_S = {"results/jagielski/task_cifar.npz": 71, "results/tramer_audit.csv": 161}
SITE = {"DPAUDIT_SLURM_ACCOUNT": "acct", "DPAUDIT_SLURM_PARTITION": "cpu-part",
        "DPAUDIT_SLURM_GPU_PARTITION": "gpu-part"}


# `python -m snakemake` whose SLURM executor checks its jobs' status every 2 s at most. The
# plugin waits 10 s longer before each check that finds no job ended (up to 3 min; no
# setting caps it), so each job of seconds on the test's SLURM waited tens of seconds to be
# seen done. The jobs, their sbatch lines and the status queries are the plugin's own.
POLL_2S = [sys.executable, "-c", """\
import sys
from snakemake_executor_plugin_slurm import Executor
wait = Executor.next_seconds_between_status_checks
Executor.next_seconds_between_status_checks = wait.setter(lambda ex, s: wait.fset(ex, min(s, 2)))
from snakemake.cli import main
sys.exit(main())
"""]


def snakemake_env(env: dict, *args, timeout=900, poll_2s=False):
    """:func:`test_workflow.snakemake` with the environment ``env`` (the GPUs hidden too);
    ``poll_2s``: through :data:`POLL_2S`."""
    python = POLL_2S if poll_2s else [sys.executable, "-m", "snakemake"]
    return subprocess.run([*python, "-s", str(ROOT / "Snakefile"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          env={**env, "CUDA_VISIBLE_DEVICES": ""})


def test_snakemake_env_hides_the_gpus(monkeypatch):
    """As :func:`test_workflow.snakemake`: the same jobs on a machine with GPUs as without."""
    seen = {}
    monkeypatch.setattr(subprocess, "run", lambda *a, **kw: seen.update(kw["env"]))
    snakemake_env({"PATH": os.environ["PATH"], "CUDA_VISIBLE_DEVICES": "0"}, "-n")
    assert seen == {"PATH": os.environ["PATH"], "CUDA_VISIBLE_DEVICES": ""}


def _resources(block: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in
                re.search(r"resources: (.*)", block).group(1).split(", "))


def _output(block: str) -> str | None:
    """A job's first output, which names it (None: a named target such as `all`)."""
    output = re.search(r"output: ([^,\n]*)", block)
    return output and output.group(1)


def test_aggregation_and_plot_rules_are_local():
    """`localrule: True` on exactly these (a dry run does not tell local jobs apart; the
    sbatch test below sees one run locally under the SLURM executor)."""
    text = "\n".join(p.read_text() for p in (ROOT / "workflow/rules").glob("*.smk"))
    blocks = re.findall(r"^rule (\w+):\n(.*?)(?=^\S|\Z)", text, re.S | re.M)
    assert {rule for rule, body in blocks if "    localrule: True" in body} == set(LOCAL_RULES)


@pytest.mark.parametrize("name", PROFILES)
def test_slurm_profiles_keep_their_cluster_settings(monkeypatch, name):
    """profiles/default is loaded on every run and wins key by key over --profile: it must
    not undo what a SLURM profile sets (latency-wait 60 s, not the local 5 s). The two
    SLURM profiles differ only in their GPUs, and neither retries a failed job."""
    pytest.importorskip(PLUGIN, reason=NO_PLUGIN)
    from snakemake.cli import parse_args

    monkeypatch.chdir(ROOT)
    _, args = parse_args(["--profile", f"profiles/{name}", "-n"])
    profile = yaml.safe_load((ROOT / f"profiles/{name}/config.yaml").read_text())
    assert args.latency_wait == profile["latency-wait"] == 60
    assert (args.executor, args.jobs, args.retries) == ("slurm", profile["jobs"], 0)
    assert args.printshellcmds and args.rerun_incomplete and args.show_failed_logs
    default = yaml.safe_load((ROOT / "profiles/default/config.yaml").read_text())
    assert not set(default) & {"latency-wait", "jobs", "executor", "retries", "set-resources",
                               "default-resources", "resources"}
    gpu = yaml.safe_load((ROOT / "profiles/slurm/config.yaml").read_text())
    assert profile["resources"] == {"gpu": 100 if name == "slurm" else 0}
    assert {k: v for k, v in profile.items() if k != "resources"} == \
        {k: v for k, v in gpu.items() if k != "resources"}
    _, local = parse_args(["-n"])  # the default profile alone
    assert local.executor is None and local.latency_wait == 5


def _dry_run(profile: str, config: str, tmp_path: Path) -> list[tuple[str, str, str]]:
    out = snakemake_env({**os.environ, **SITE}, "-n", "--profile", str(ROOT / "profiles" / profile),
                        "--directory", str(tmp_path), "--configfile", str(ROOT / "config" / config))
    assert out.returncode == 0, out.stderr
    return _jobs(out.stdout)


def test_gpu_cluster_jobs_at_paper_scale(tmp_path):
    """profiles/slurm, config.yaml, a submitting host without a GPU: training jobs ask for
    one GPU on the GPU partition, the rest for none on the CPU partition, all with the
    account; every time limit is at least 5 x what the job took on the H100."""
    pytest.importorskip(PLUGIN, reason=NO_PLUGIN)
    seen = {}
    for _, rule, block in _dry_run("slurm", "config.yaml", tmp_path):
        res = _resources(block)
        name = _output(block)
        if rule in LOCAL_RULES or not name:
            assert "runtime" not in res and "slurm_account" not in res, name
            continue
        assert res["slurm_account"] == "acct", name
        gpu = rule in GPU_RULES and not name.endswith("task_fmnist.npz")
        assert res.get("gpu", "0") == ("1" if gpu else "0"), (name, res)
        assert res["slurm_partition"] == ("gpu-part" if gpu else "cpu-part"), (name, res)
        assert int(res["mem_mb"]) >= (6000 if gpu else 2000), (name, res)
        seen[name] = int(res["runtime"])
    assert set(H100_S) <= set(seen)
    for name, seconds in H100_S.items():
        assert seen[name] * 60 >= 5 * seconds, (name, seen[name], seconds)
    assert seen[SCORES + "fmnist_fnn_clipbkd"] < 120  # not a guess of hours


def test_cpu_cluster_jobs(tmp_path):
    """profiles/slurm-cpu, quick.yaml: no job asks for a GPU, training runs on the CPU
    partition with 2 CPUs, and the time limits cover 3 x the quick run's times."""
    pytest.importorskip(PLUGIN, reason=NO_PLUGIN)
    seen = {}
    for _, rule, block in _dry_run("slurm-cpu", "quick.yaml", tmp_path):
        res = _resources(block)
        assert res.get("gpu", "0") == "0", (rule, res)
        if rule not in LOCAL_RULES and _output(block):
            assert res["slurm_partition"] == "cpu-part", (rule, res)
            seen[_output(block)] = int(res["runtime"])
        if rule in GPU_RULES:
            assert int(re.search(r"threads: (\d+)", block).group(1)) == 2, rule
    for name, seconds in QUICK_CPU_S.items():
        assert seen[name] * 60 >= 3 * seconds, (name, seen[name], seconds)


def test_training_jobs_without_gpus_run_as_cpu_jobs(tmp_path):
    """A local run without GPUs: the training jobs ask for gpu=0 and 2 threads, so --cores
    4 starts two at a time, and train where their config's `device: auto` says; no other
    job has a gpu resource. `--resources gpu=N` gives the run N GPUs: the training jobs
    then ask for one each, and are passed `--device cuda`."""
    quick = str(ROOT / "config" / "quick.yaml")  # snakemake() hides the GPUs
    for limit, want in ((None, "0"), ("gpu=2", "1")):
        more = ["--resources", limit] if limit else []
        out = snakemake("-n", "--cores", "4", *more, "--directory", str(tmp_path),
                        "--configfile", quick)
        assert out.returncode == 0, out.stderr
        seen = set()
        for _, rule, block in _jobs(out.stdout):
            res = _resources(block)
            if rule in GPU_RULES:
                seen.add(rule)
                fmnist_task = _output(block).endswith("task_fmnist.npz")
                assert res["gpu"] == ("0" if fmnist_task else want), (rule, res)
                assert int(re.search(r"threads: (\d+)", block).group(1)) == 2, rule
                # config device `auto`: `cuda` exactly where the job reserves a GPU
                device = "auto" if res["gpu"] == "0" else "cuda"
                assert f" --device {device} " in block, (rule, block)
            else:
                assert "gpu" not in res, (rule, res)
        assert seen == set(GPU_RULES)


def _fake_slurm(bin_dir: Path, refusal: str = "test: not submitted") -> None:
    """An sbatch that records its command line and refuses the job saying `refusal`, an
    sacctmgr that knows the account, and SLURM query tools that fail."""
    bin_dir.mkdir()
    for tool in ("sinfo", "sacct", "squeue", "sshare", "scontrol", "scancel"):
        (bin_dir / tool).write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "sacctmgr").write_text("#!/bin/sh\necho acct\n")
    (bin_dir / "sbatch").write_text('#!/bin/sh\necho "sbatch $*" >> "$SBATCH_LOG"\n'
                                    f'echo "{refusal}" >&2\nexit 1\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)


@pytest.mark.slow
def test_sbatch_lines_keep_the_gpu_under_overrides(tmp_path):
    """The installed plugin's sbatch lines, with a rule's time limit and the default
    resources overridden on the command line (each replaces the profile's whole block of
    that name): the GPU jobs still ask for one GPU on the GPU partition with their memory,
    the overridden rule gets its new limit and the others keep theirs; 2 CPUs per task.
    sbatch is a stub that records the call and refuses the job."""
    pytest.importorskip(PLUGIN, reason=NO_PLUGIN)
    run = tmp_path / "run"
    (run / "results/data").mkdir(parents=True)
    (run / "results/jagielski").mkdir()
    for i, path in enumerate(("results/data/fmnist.csv", "results/data/cifar.csv",
                              "results/jagielski/task_fmnist.npz",  # inputs, oldest first
                              "results/jagielski/init_fmnist_lr.pt",  # the one-run's fixed init
                              "results/jagielski/init_fmnist_fnn.pt",
                              "results/ridge_audit.csv")):
        (run / path).write_text("")
        os.utime(run / path, (1e9 + i, 1e9 + i))
    _fake_slurm(tmp_path / "bin")
    log = tmp_path / "sbatch.log"
    env = {**os.environ, **SITE, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
           "SBATCH_LOG": str(log)}
    targets = ["results/jagielski/task_cifar.npz", "results/onerun_dpsgd.csv",
               "results/tramer_audit.csv", "figures/ridge_audit.pdf"]
    # every submission refused: no status to wait 40 s for (the plugin's default) on exit
    out = snakemake_env(env, "--profile", str(ROOT / "profiles/slurm"), "--keep-going",
                        "--slurm-init-seconds-before-status-checks", "1",
                        "--set-resources", "jagielski_task:runtime=123",
                        "--default-resources", "mem_mb=100", "slurm_account=other",
                        "--directory", str(run), "--configfile", str(ROOT / "config/quick.yaml"),
                        "--", *targets)
    assert out.returncode != 0  # every submission refused
    calls = {re.search(r"--comment rule_([a-z_]+?)(?:_wildcards|\s)", line).group(1): line.split()
             for line in log.read_text().splitlines()}
    assert set(calls) == {"jagielski_task", "onerun_audit", "tramer_audit"}
    assert "localrule ridge_plot:" in out.stdout + out.stderr  # ran here, not submitted
    for rule, args in calls.items():
        gpu = rule != "onerun_audit"
        assert ("--gpus=1" in args) == gpu, (rule, args)
        assert args[args.index("-p") + 1] == ("gpu-part" if gpu else "cpu-part"), (rule, args)
        assert args[args.index("-A") + 1] == "acct", (rule, args)
        assert int(args[args.index("--mem") + 1]) >= (6000 if gpu else 2000), (rule, args)
        assert "--cpus-per-task=2" in args, (rule, args)
    assert calls["jagielski_task"][calls["jagielski_task"].index("-t") + 1] == "123"
    assert calls["tramer_audit"][calls["tramer_audit"].index("-t") + 1] == "10"


def test_gpu_profile_on_a_cluster_without_gpus_points_at_the_cpu_profile(tmp_path):
    """profiles/slurm where SLURM refuses `--gpus=1` (its words, from a stubbed sbatch): the
    run ends with a line naming profiles/slurm-cpu and the GPU partition variable, not
    only Snakemake's "command exited with non-zero exit code"."""
    pytest.importorskip(PLUGIN, reason=NO_PLUGIN)
    run = tmp_path / "run"
    (run / "results/data").mkdir(parents=True)
    (run / "results/data/cifar.csv").write_text("")
    _fake_slurm(tmp_path / "bin", "sbatch: error: Batch job submission failed: Invalid "
                                  "generic resource (gres) specification")
    env = {**os.environ, **SITE, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
           "SBATCH_LOG": str(tmp_path / "sbatch.log")}
    out = snakemake_env(env, "--profile", str(ROOT / "profiles/slurm"),
                        "--slurm-init-seconds-before-status-checks", "1",  # none to check
                        "--directory", str(run), "--configfile",
                        str(ROOT / "config/quick.yaml"), "--",
                        "results/jagielski/task_cifar.npz")
    assert out.returncode != 0 and "--gpus=1" in (tmp_path / "sbatch.log").read_text()
    assert "dpaudit: SLURM refused a job's GPU (--gpus=1): this cluster or partition has no " \
           "GPUs. Run with --profile profiles/slurm-cpu" in out.stderr


def test_logged_keeps_the_log_of_a_failed_attempt(tmp_path):
    """workflow/scripts/logged: the command's stderr goes to the log; a failure or a
    SIGTERM (a SLURM time limit) keeps a copy named after the SLURM job, which the next
    attempt's deletion of the log leaves alone; a success keeps none."""
    logged = str(ROOT / "workflow/scripts/logged")
    log = tmp_path / "job.log"
    env = {**os.environ, "SLURM_JOB_ID": "41"}
    ok = subprocess.run([logged, str(log), "sh", "-c", "echo fine >&2"], env=env)
    assert ok.returncode == 0 and log.read_text() == "fine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.log"]
    bad = subprocess.run([logged, str(log), "sh", "-c", "echo boom >&2; exit 2"], env=env,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "job.failed-41.log" in bad.stderr
    log.unlink()  # what Snakemake does before the next attempt
    assert (tmp_path / "job.failed-41.log").read_text() == "boom\n"
    env["SLURM_JOB_ID"] = "42"
    slow = subprocess.Popen([logged, str(log), "sh", "-c", "echo started >&2; sleep 30"],
                            env=env, stderr=subprocess.DEVNULL)
    deadline = time.time() + 10
    while not (log.exists() and log.read_text()) and time.time() < deadline:
        time.sleep(0.05)
    slow.send_signal(signal.SIGTERM)
    assert slow.wait(timeout=10) == 128 + signal.SIGTERM
    assert (tmp_path / "job.failed-42.log").read_text() == "started\n"


def _path_without_dpaudit(path: str) -> str:
    """``path`` (a PATH) without the folders that hold a `dpaudit`."""
    return os.pathsep.join(p for p in path.split(os.pathsep)
                           if p and not (Path(p) / "dpaudit").exists())


def test_jobs_call_the_dpaudit_of_snakemakes_python(tmp_path):
    """A venv's snakemake run without activating the venv (no dpaudit on PATH): the jobs
    find the venv's."""
    import sysconfig

    if not (Path(sysconfig.get_path("scripts")) / "dpaudit").exists():
        pytest.skip("this Python's dpaudit is not installed as a script (pip install -e .)")
    cfg = load("quick.yaml")
    cfg["ridge"].update(n=40, d=40, m=40, lam=320.0, rho=[5.0], repeats=1)
    env = {**os.environ, "PATH": _path_without_dpaudit(os.environ["PATH"])}
    out = snakemake_env(env, "--cores", "1", "--directory", str(tmp_path), "--configfile",
                        str(write_config(tmp_path, cfg)), "--", "results/ridge_audit.csv")
    assert out.returncode == 0, out.stderr[-2000:]
    assert read_table(tmp_path / "results/ridge_audit.csv")[0].rho.tolist() == [5.0]


def test_no_dpaudit_to_call_stops_at_start_up(tmp_path):
    """A Python whose scripts folder has no dpaudit, with none on PATH, stops at start-up
    naming that Python (not `dpaudit: command not found` from every job)."""
    bare = tmp_path / "bare"  # a venv without packages: snakemake and dpaudit come from
    venv.create(bare, with_pip=False)  # PYTHONPATH, its scripts folder is empty
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "",
           "PATH": _path_without_dpaudit(os.environ["PATH"]),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), *filter(None, sys.path)])}
    out = subprocess.run([str(bare / "bin/python"), "-m", "snakemake", "-n", "-s",
                          str(ROOT / "Snakefile"), "--directory", str(tmp_path / "w")],
                         cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode != 0
    assert f"dpaudit: command not found: the jobs call the `dpaudit` command of the Python " \
           f"that runs snakemake ({bare / 'bin/python'})" in out.stdout + out.stderr


# --- a real SLURM ---------------------------------------------------------------------

SLURM_TOOLS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "sinfo",
           "scontrol", "scancel")


def _which(name: str) -> str | None:
    return shutil.which(name, path=os.pathsep.join([os.environ["PATH"], "/usr/sbin", "/sbin"]))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _slurm_conf(d: Path, host: str) -> str:
    mem_mb = int(Path("/proc/meminfo").read_text().split()[1]) // 1024
    return f"""\
ClusterName=dpaudit-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge.sock
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
MinJobAge=600
GresTypes=gpu
NodeName={host} NodeAddr=127.0.0.1 CPUs=4 RealMemory={mem_mb} Gres=gpu:1 State=UNKNOWN
PartitionName=cpu Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


@pytest.fixture
def slurm_cluster(tmp_path_factory):
    """A one-node SLURM of this machine: its own munged, slurmctld and slurmd, started
    here and stopped by PID at the end (jobs cancelled first), however the test ends.
    Yields the environment for SLURM's commands."""
    missing = [name for name in SLURM_TOOLS if not _which(name)]
    if os.name != "posix" or os.geteuid() != 0 or missing:
        pytest.skip("a real SLURM needs root and Debian's slurmctld, slurmd, slurm-client "
                    "and munge (.ci/run installs them: apt-get install --no-install-"
                    f"recommends slurmctld slurmd slurm-client munge); missing: {missing}, "
                    f"root: {os.name == 'posix' and os.geteuid() == 0}")
    pytest.importorskip(PLUGIN, reason=NO_PLUGIN)
    d = tmp_path_factory.mktemp("slurm")
    (d / "state").mkdir()
    (d / "spool").mkdir()
    host = socket.gethostname().split(".")[0]
    (d / "slurm.conf").write_text(_slurm_conf(d, host))
    # One GPU that SLURM counts and hands out (`--gpus=1`) without a device behind it.
    (d / "gres.conf").write_text("AutoDetect=off\nName=gpu File=/dev/null\n")
    # The jobstep plugin drops SLURM_* variables, SLURM_CONF too, before its srun, which
    # then looks for the cluster's config where a real node has it (/etc/slurm).
    (d / "bin").mkdir()
    (d / "bin/srun").write_text(f'#!/bin/sh\nSLURM_CONF={d}/slurm.conf exec {_which("srun")} "$@"\n')
    (d / "bin/srun").chmod(0o755)
    env = {**os.environ, "SLURM_CONF": str(d / "slurm.conf"),
           "PATH": f"{d / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run([_which("mungekey"), "--create", f"--keyfile={d}/munge.key"], check=True)
    daemons = []
    try:
        for cmd in ([_which("munged"), "--foreground", "--force", f"--key-file={d}/munge.key",
                     f"--socket={d}/munge.sock", f"--pid-file={d}/munged.pid",
                     f"--log-file={d}/munged.log", f"--seed-file={d}/munged.seed"],
                    [_which("slurmctld"), "-D", "-f", f"{d}/slurm.conf"],
                    [_which("slurmd"), "-D", "-f", f"{d}/slurm.conf"]):
            daemons.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL))
            if cmd[0].endswith("munged"):
                _wait_for(lambda: (d / "munge.sock").exists(), 10, "munged's socket")
        _wait_for(lambda: subprocess.run([_which("sinfo"), "-h", "-o", "%T"], env=env,
                                         capture_output=True, text=True).stdout.strip() == "idle",
                  30, "the node to be idle")
        yield env
    finally:
        _stop(daemons, env)


def _wait_for(done, seconds: float, what: str) -> None:
    deadline = time.time() + seconds
    while not done():
        if time.time() > deadline:
            raise TimeoutError(f"waited {seconds} s for {what}")
        time.sleep(0.2)


def _stop(daemons: list[subprocess.Popen], env: dict) -> None:
    """Cancel the cluster's jobs, wait for them to end, then stop the daemons by PID."""
    if len(daemons) == 3:
        jobs = subprocess.run([_which("squeue"), "-h", "-o", "%i"], env=env,
                              capture_output=True, text=True).stdout.split()
        if jobs:
            subprocess.run([_which("scancel"), *jobs], env=env)
            try:
                _wait_for(lambda: not subprocess.run(
                    [_which("squeue"), "-h", "-o", "%i"], env=env, capture_output=True,
                    text=True).stdout.split(), 30, "the cancelled jobs to end")
            except TimeoutError:
                pass
    for proc in reversed(daemons):  # slurmd, slurmctld, munged
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_real_slurm_run_equals_a_local_run(tmp_path, slurm_cluster):
    """A tiny config through profiles/slurm-cpu on a running one-node SLURM, without a
    dpaudit on PATH: HW3's sweep, the FMNIST task, the fixed init and a training group are 4
    SLURM jobs on partition `cpu` with 2 CPUs and their time limits; the data rule runs on
    this host; every result equals a local run's (the .pt init as tensors)."""
    from dpaudit.dpsgd import load_params

    _fake_image_data(tmp_path / "data")
    conf = str(write_config(tmp_path, _tiny_config(tmp_path / "data")))
    targets = ["results/hw3_eps_vs_eps.csv", "results/jagielski/scores/fmnist_fnn_clipbkd"]
    local = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--cores", "2",
         "--directory", str(tmp_path / "local"), "--configfile", conf, "--", *targets],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    env = {**slurm_cluster, "DPAUDIT_SLURM_PARTITION": "cpu",
           "PATH": _path_without_dpaudit(slurm_cluster["PATH"])}
    out = snakemake_env(env, "--profile", str(ROOT / "profiles/slurm-cpu"),
                        "--slurm-init-seconds-before-status-checks", "2",
                        "--slurm-status-command", "squeue", "--directory",
                        str(tmp_path / "slurm"), "--configfile", conf, "--", *targets,
                        timeout=600, poll_2s=True)
    _, local_err = local.communicate(timeout=600)
    assert local.returncode == 0, local_err[-3000:]
    assert out.returncode == 0, out.stderr[-5000:]
    assert "localrule data:" in out.stdout + out.stderr
    jobs = subprocess.run([_which("scontrol"), "show", "jobs", "-o"], env=slurm_cluster,
                          capture_output=True, text=True, check=True).stdout.splitlines()
    fields = [dict(f.split("=", 1) for f in line.split() if "=" in f) for line in jobs]
    cpus = {f["Comment"].split("_wildcards")[0]: f["NumCPUs"] for f in fields}
    assert cpus == {"rule_hw3_audit": "2", "rule_jagielski_task": "2",  # their threads
                    "rule_jagielski_init": "1", "rule_jagielski_train": "2"}, jobs
    for f in fields:
        assert (f["JobState"], f["Partition"], f["TimeLimit"]) == \
            ("COMPLETED", "cpu", "00:10:00"), f
    files = sorted(p.relative_to(tmp_path / "local") for p in (tmp_path / "local/results")
                   .rglob("*") if p.is_file())
    assert len(files) >= 8
    for rel in files:
        a, b = tmp_path / "local" / rel, tmp_path / "slurm" / rel
        if rel.suffix == ".pt":  # torch.save's zip is not byte-reproducible
            (pa, ma), (pb, mb) = load_params(a), load_params(b)
            assert ma == mb and all(x.equal(y) for x, y in zip(pa.W + pa.b, pb.W + pb.b)), rel
        else:
            assert a.read_bytes() == b.read_bytes(), rel


@pytest.mark.slow
def test_real_slurm_gpu_job_keeps_its_whole_gpu(tmp_path, slurm_cluster):
    """profiles/slurm on the one-node SLURM, whose GPU is a count without a device: a job
    that reserves a GPU (`job(gpu_s=...)`, `job_device("auto")`, the config's
    jobs_per_gpu 4) is submitted with --gpus=1, and the Snakemake inside the job runs it
    with the `--device cuda` the host printed and without DPAUDIT_JOBS_PER_GPU (a share of
    the card's memory for 4 jobs); a local run's job is told of the 4."""
    (tmp_path / "Snakefile").write_text(f"""\
from snakemake.exceptions import WorkflowError
config["jobs_per_gpu"] = 4
include: {str(ROOT / "workflow/rules/common.smk")!r}
rule probe:
    output: "probe.txt"
    params: device=job_device("auto")
    resources: **job(mem_mb=100, cpu_s=1, gpu_s=1)
    shell: "echo jobs_per_gpu=${{{{DPAUDIT_JOBS_PER_GPU:-unset}}}} --device {{params.device}} > {{output}}"
""")
    env = {**slurm_cluster, "DPAUDIT_SLURM_GPU_PARTITION": "cpu"}
    env.pop("DPAUDIT_JOBS_PER_GPU", None)
    runs = {"slurm": [*POLL_2S, "--profile", str(ROOT / "profiles/slurm"),
                      "--slurm-init-seconds-before-status-checks", "2",
                      "--slurm-status-command", "squeue"],
            "local": [sys.executable, "-m", "snakemake", "--cores", "1", "--resources", "gpu=1"]}
    for name, args in runs.items():
        out = subprocess.run([*args, "-s", str(tmp_path / "Snakefile"),
                              "--directory", str(tmp_path / name), "probe.txt"],
                             cwd=ROOT, capture_output=True, text=True, timeout=300,
                             env={**env, "CUDA_VISIBLE_DEVICES": ""})
        assert out.returncode == 0, out.stderr[-5000:]
        assert " --device cuda " in out.stdout + out.stderr + " "  # what the host printed
    assert (tmp_path / "slurm/probe.txt").read_text() == "jobs_per_gpu=unset --device cuda\n"
    assert (tmp_path / "local/probe.txt").read_text() == "jobs_per_gpu=4 --device cuda\n"
    job = subprocess.run([_which("scontrol"), "show", "jobs", "-o"], env=slurm_cluster,
                         capture_output=True, text=True, check=True).stdout
    assert "TresPerJob=gres:gpu:1" in job and "JobState=COMPLETED" in job, job
