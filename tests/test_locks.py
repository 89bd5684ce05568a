"""One writer per result folder (dpaudit.locks): a second trainer of a group folder that
another is training stops at once, naming the folder; the lock goes with its holder."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from dpaudit import features
from dpaudit.cli import main
from dpaudit.locks import Busy, hold, lock_file
from test_jagielski import TRAIN_SPEC, _task


def test_a_second_holder_is_refused_naming_the_folder(tmp_path):
    folder = tmp_path / "scores/cifar_lr_clipbkd"
    with hold(folder):
        with pytest.raises(Busy, match=f"^{folder} is being written by another process "
                                       f"\\(it holds {lock_file(folder)}\\)"):
            with hold(folder):
                pass
    with hold(folder):  # released: taken again
        pass
    assert not folder.exists()  # the lock lies beside the folder, which Snakemake deletes
    assert lock_file(folder).read_bytes() == b""  # the same after every run


def _args(tmp_path, spec):
    return ["jagielski-train", "--task", str(tmp_path / "task.npz"), "--dataset", "fmnist",
            "--arch", "fnn", "--attack", "clipbkd", "--cells", json.dumps([[1, "g2", "4"]]),
            "--spec", json.dumps(spec), "--seed", "5", "--device", "cpu",
            "--store", str(tmp_path / "trained"), "--out-dir", str(tmp_path / "scores/group")]


def test_two_trainers_of_one_group_folder(tmp_path, capsys):
    """A real trainer in another process, then a second of the same folder here: the second
    exits at once naming the folder and writes nothing; once the first is gone (stopped as
    a time limit stops it), a trainer of that folder runs."""
    features.save_features(tmp_path / "task.npz", _task(np.random.default_rng(7)).arrays(),
                           {"dataset": "toy"})
    slow = {**TRAIN_SPEC, "trials": 100_000, "epochs": 50}  # minutes: stopped below
    first = subprocess.Popen([sys.executable, "-c", "import sys; from dpaudit.cli import main; "
                              "sys.exit(main(sys.argv[1:]))", *_args(tmp_path, slow)],
                             stderr=subprocess.PIPE, text=True)
    try:
        # The first has the lock once it says what it trains (after taking it).
        deadline = time.time() + 120
        while "trials per side" not in first.stderr.readline():
            assert first.poll() is None and time.time() < deadline
        with pytest.raises(SystemExit) as stop:
            main(_args(tmp_path, TRAIN_SPEC))
        assert str(stop.value).startswith(
            f"dpaudit jagielski-train: {tmp_path / 'scores/group'} is being written by "
            f"another process (it holds {lock_file(tmp_path / 'scores/group')})")
        assert not (tmp_path / "scores/group").exists()
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)
    assert main(_args(tmp_path, TRAIN_SPEC)) == 0
    assert (tmp_path / "scores/group/c1_g2_e4.csv").exists()
