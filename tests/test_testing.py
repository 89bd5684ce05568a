"""`dpaudit.testing.assert_private`: the sequential audit as a test assertion, its failure
reproduced by the command line it names, and the example test file of users' suites."""

import gzip
import importlib.util
import shlex
from pathlib import Path

import numpy as np
import pytest

from dpaudit.cli import main
from dpaudit.experiments import tramer
from dpaudit.io import read_table
from dpaudit.testing import NOT_A_PROOF, Options, assert_private
from fakedata import idx_bytes

SPEC = {"epochs": 4, "batch_size": 60, "lr": 2000.0, "clip": 0.01, "device": "cpu"}
CHEAP = {"runs": 40, "alpha": 0.05, "seed": 3}


def _options(root) -> Options:
    return Options(val_runs=10, n_train=60, data_root=root)


@pytest.fixture
def fmnist_root(tmp_path):
    """Fake Fashion-MNIST IDX files: classes 0 and 1 alternating, pixels of class 1 brighter."""
    raw = tmp_path / "data" / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", 400), ("t10k", 40)):
        labels = (np.arange(n) % 2).astype(np.uint8)
        images = rng.integers(0, 128, size=(n, 28, 28)) + 100 * labels[:, None, None]
        for name, arr in ((f"{split}-images-idx3-ubyte", images.astype(np.uint8)),
                          (f"{split}-labels-idx1-ubyte", labels)):
            (raw / f"{name}.gz").write_bytes(gzip.compress(idx_bytes(arr)))
    return tmp_path / "data"


def test_a_violation_fails_with_numbers_the_named_command_reproduces(fmnist_root, tmp_path,
                                                                     capsys):
    with pytest.raises(AssertionError) as failed:
        assert_private("buggy", 1.0, 1e-5, SPEC, options=_options(fmnist_root), **CHEAP)
    text = str(failed.value)
    assert "buggy violates" in text and "certified eps_LB = " in text
    command = text.split("reproduce: ")[1]
    assert command.startswith("dpaudit audit-impl --sequential --train buggy")
    argv = shlex.split(command)[1:]
    argv[argv.index("--out") + 1] = str(tmp_path / "a.csv")
    assert main(argv + ["--data-root", str(fmnist_root)]) == 0
    row = read_table(tmp_path / "a.csv")[0].iloc[0]
    assert f"certified eps_LB = {row.eps_lb:.4g} " in text
    assert f"{row.runs_in} + {row.runs_out} evaluation runs" in text
    assert row.stop_reason == "certified" and row.runs_in < CHEAP["runs"]
    assert row.verdict in (tramer.VIOLATES, tramer.VIOLATES_PROFILE)


def test_no_violation_passes_and_says_it_is_not_a_proof(fmnist_root):
    check = assert_private("fixed", 1.0, 1e-5, SPEC, options=_options(fmnist_root), **CHEAP)
    assert check.row["stop_reason"] == "max_runs" and check.row["runs"] == CHEAP["runs"]
    assert check.row["verdict"] == tramer.NO_VIOLATION and NOT_A_PROOF in check.message
    assert check.command.startswith("dpaudit audit-impl --sequential --train fixed")


def test_bad_arguments_are_refused_before_training():
    with pytest.raises(ValueError, match="runs=5: too few"):
        assert_private("fixed", 1.0, 1e-5, SPEC, runs=5)
    with pytest.raises(ValueError, match="X, y: give both"):
        assert_private("fixed", 1.0, 1e-5, SPEC, X=np.zeros((4, 2)), runs=100)
    with pytest.raises(ValueError, match=r"options=\{'val_runs': 5\}\): must be a "
                                         r"dpaudit.testing.Options"):
        assert_private("fixed", 1.0, 1e-5, SPEC, options={"val_runs": 5})


def test_the_example_test_file_passes():
    """examples/test_assert_private.py, as a user's suite runs it: the correct DP-SGD
    passes, the broken one fails with a certified violation."""
    path = Path(__file__).parents[1] / "examples" / "test_assert_private.py"
    spec = importlib.util.spec_from_file_location("example_assert_private", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.test_dp_sgd_is_not_caught_violating_its_claim()
    example.test_broken_dp_sgd_is_caught()
