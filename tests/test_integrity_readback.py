"""Every file a job reads back is checked against the content hash recorded when it was
written: weights (``.pt``), task and feature files (``.npz``) and tables. A damaged one is
named with what is wrong and the command that makes it again, and never used; a table
without a hash is read only where its provenance names an older version, which the
message says; a kept block with a folder in its place stops the job in one line."""

from __future__ import annotations

import hashlib
import json
import os
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from dpaudit import __version__, dpsgd, features, trials
from dpaudit.cli import main
from dpaudit.io import BODY_SHA256, CONTENT_SHA256, HASHED_SINCE, BadInputFile, read_table
from test_jagielski import TRAIN_SPEC, _task, _train_cli

ROOT = Path(__file__).resolve().parents[1]


def _flip_middle(path: Path, count: int = 16) -> None:
    """Invert ``count`` bytes in the middle of ``path``, its modification time kept."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid:mid + count] = bytes(b ^ 0xFF for b in data[mid:mid + count])
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _run(argv, capsys) -> tuple[int, list[str]]:
    """Exit status and lines on stderr of the command ``argv`` (its progress lines too)."""
    capsys.readouterr()
    code = main([str(a) for a in argv])
    return code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def _refused(argv, capsys, path, reason: str, redo) -> None:
    """``argv`` exits 2, its last line (the only one not of progress) naming ``path``,
    ``reason`` and the command that makes ``redo`` again."""
    code, err = _run(argv, capsys)
    command = f"dpaudit {argv[0]}: "
    assert code == 2 and err[-1].startswith(f"{command}bad input file {path}: "), err
    assert not [line for line in err[:-1] if not line.startswith(command)], err
    assert reason in err[-1] and f"; redo it: snakemake --forcerun {redo} " in err[-1], err


@pytest.fixture
def run_folder(tmp_path, monkeypatch):
    """``tmp_path`` as the working folder: the workflow names its files relative to it,
    and only such a path is named in a `snakemake --forcerun` (an absolute one is no
    output of the workflow's)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def task_file(run_folder):
    """A toy FMNIST-like task of 400 features (logistic regression: 800 weights)."""
    path = Path("task.npz")
    features.save_features(path, _task(np.random.default_rng(7), d=400).arrays(),
                           {"command": "jagielski-task"})
    return path


def _init(task, out) -> list[str]:
    return ["jagielski-init", "--dataset", "fmnist", "--arch", "lr", "--task", str(task),
            "--hidden", str(TRAIN_SPEC["hidden"]), "--seed", "0", "--out", str(out)]


def _train_fixed(tmp_path, init):
    return ["jagielski-train", "--task", tmp_path / "task.npz", "--dataset", "fmnist",
            "--arch", "lr", "--attack", "mi", "--cells", json.dumps([[1.0, "fixed", "4"]]),
            "--init-file", init, "--spec", json.dumps(TRAIN_SPEC),
            "--seed", "0", "--device", "cpu", "--out-dir", tmp_path / "out"]


def test_an_init_file_with_16_bytes_flipped_is_refused_not_trained_from(tmp_path, capsys,
                                                                          task_file):
    """The shared "fixed" initialisation with 16 bytes flipped in the middle (torch reads
    it without complaint, five weights wrong) stops the training job before any model,
    naming the file and the command that draws it again."""
    init = Path("init_fmnist_lr.pt")
    assert main(_init(task_file, init)) == 0
    good = torch.load(init, weights_only=True)["W"][0]
    _flip_middle(init)
    bad = torch.load(init, weights_only=True)["W"][0]  # no error from torch: silently wrong
    assert (bad != good).sum() >= 4
    _refused(_train_fixed(tmp_path, init), capsys, init,
             "its content does not match the content hash recorded when it was written",
             init)
    assert not list(tmp_path.glob("out/*.csv"))
    # the intact file trains
    assert main(_init(task_file, init)) == 0
    assert main([str(a) for a in _train_fixed(tmp_path, init)]) == 0


def _rezipped(path: Path, change) -> None:
    """``path`` (an .npz) written again with ``change`` applied to its arrays: a file with
    consistent zip checksums, as an edit with numpy would leave it."""
    with np.load(path) as f:
        arrays = {k: f[k] for k in f.files}
    change(arrays)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


def _alter_x(arrays):
    arrays["X"] = arrays["X"].copy()
    arrays["X"][3, 7] += 0.5


TASK_DAMAGE = {
    "16_bytes_flipped": (_flip_middle, "truncated or altered"),
    "a_value_changed": (lambda p: _rezipped(p, _alter_x), "does not match the content hash"),
    "no_hash": (lambda p: _rezipped(p, lambda a: a.pop(CONTENT_SHA256)),
                f"no content hash recorded (written by a version older than {HASHED_SINCE}"),
}


@pytest.mark.parametrize("how", sorted(TASK_DAMAGE))
def test_a_damaged_task_file_is_refused_by_every_reader(tmp_path, capsys, task_file, how):
    damage, reason = TASK_DAMAGE[how]
    damage(task_file)
    init = _init(task_file, tmp_path / "init.pt")
    train = ["jagielski-train", "--task", task_file, "--dataset", "fmnist", "--arch", "lr",
             "--attack", "mi", "--cells", json.dumps([[1.0, "g1", "4"]]), "--spec",
             json.dumps(TRAIN_SPEC), "--seed", "0", "--device", "cpu",
             "--out-dir", tmp_path / "out"]
    for argv in (init, train):
        _refused(argv, capsys, task_file, reason, task_file)
    assert not (tmp_path / "init.pt").exists() and not list(tmp_path.glob("out/*.csv"))
    with pytest.raises(BadInputFile, match=re.escape(reason)):
        features.load_features(task_file)


def _resaved(path: Path, change) -> None:
    """``path`` (a .pt) saved again by torch with ``change`` applied to what it holds, its
    recorded hash kept."""
    blob = torch.load(path, weights_only=True)
    change(blob)
    torch.save(blob, path)


def test_altered_weights_and_feature_extractors_are_refused(tmp_path):
    model = dpsgd.ModelSpec("fnn", 6, 4)
    saved = tmp_path / "models.pt"
    dpsgd.save_params(saved, dpsgd.init_params(model, 3, 0, device="cpu"), model)
    assert dpsgd.load_params(saved)[0].K == 3
    _resaved(saved, lambda b: b["b"][1].add_(1e-3))
    with pytest.raises(BadInputFile, match="does not match the content hash"):
        dpsgd.load_params(saved)
    _resaved(saved, lambda b: b.pop(CONTENT_SHA256))
    with pytest.raises(BadInputFile, match="no content hash recorded"):
        dpsgd.load_params(saved)

    extractor = tmp_path / "extractor.pt"
    features.save_extractor(extractor, features.CifarCNN(2), {"seed": 1})
    assert features.load_extractor(extractor)[1] == {"seed": 1}
    _resaved(extractor, lambda b: b["provenance"].update(seed=2))
    with pytest.raises(BadInputFile, match="does not match the content hash"):
        features.load_extractor(extractor)


# -- score tables --------------------------------------------------------------------------

AUDIT = {"alpha": 0.05, "delta": 1e-5, "select_frac": 0.5, "trials": 4}


@pytest.fixture
def score_table(run_folder):
    features.save_features(run_folder / "task.npz", _task(np.random.default_rng(7)).arrays(),
                           {"dataset": "toy"})
    assert _train_cli(run_folder, TRAIN_SPEC, [[1, "g2", "4"]], "--store",
                      str(run_folder / "kept")) == 0
    return Path("out", "c1_g2_e4.csv")


def _audit(scores, out):
    return ["jagielski-audit", "--experiment", "fig2", "--scores", scores, "--spec",
            json.dumps(AUDIT), "--seed", "0", "--out", out]


def _without_hash(path: Path, version: str | None) -> None:
    """``path`` with its recorded hash removed, its first test accuracy changed and its
    provenance naming ``version`` (None: no version)."""
    head, body = path.read_text().split("\n", 1)
    meta = json.loads(head.split(": ", 1)[1])
    meta.pop(BODY_SHA256, None), meta.pop("dpaudit_version", None)
    meta.update({} if version is None else {"dpaudit_version": version})
    lines = body.split("\n")
    col = lines[0].split(",").index("test_acc")
    fields = lines[1].split(",")
    fields[col] = str(float(fields[col]) + 0.01)
    lines[1] = ",".join(fields)
    path.write_text(f"# dpaudit-provenance: {json.dumps(meta, sort_keys=True)}\n"
                    + "\n".join(lines))


def test_every_table_records_its_hash_and_a_table_without_one_is_refused(tmp_path, capsys,
                                                                           score_table):
    """A table of this version always records its hash (every table is written by
    write_table), so one without is refused as altered, and so is one whose header names
    an older version: that claim is as easily written as the hash is dropped, and every
    reference table records its hash."""
    assert [*map(int, __version__.split("."))] >= [*map(int, HASHED_SINCE.split("."))]
    _, meta = read_table(score_table)
    assert meta[BODY_SHA256] and meta["dpaudit_version"] == __version__
    writers = [p.relative_to(ROOT / "src") for p in (ROOT / "src").rglob("*.py")
               if re.search(r"\.to_csv\(|torch\.save\(|np\.save", p.read_text())]
    assert sorted(map(str, writers)) == ["dpaudit/features.py", "dpaudit/io.py"]

    out = tmp_path / "fig2.csv"
    _without_hash(score_table, __version__)
    _refused(_audit(score_table, out), capsys, score_table,
             f"no content hash recorded, yet its provenance names dpaudit {__version__}, "
             "which records one: altered since it was written", score_table.parent)
    _without_hash(score_table, None)
    _refused(_audit(score_table, out), capsys, score_table,
             "no content hash and no dpaudit version recorded", score_table.parent)
    assert not out.exists()
    # nor is one whose header claims an older version (the claim is as easily written)
    _without_hash(score_table, "0.1.0")
    _refused(_audit(score_table, out), capsys, score_table,
             f"no content hash recorded (its header names dpaudit 0.1.0, older than "
             f"{HASHED_SINCE}): its rows cannot be checked, so it is not read; make it again "
             "with this version", score_table.parent)
    assert not out.exists()
    # every reference table records its hash
    for ref in sorted((ROOT / "reference").glob("*.csv")):
        assert read_table(ref)[1][BODY_SHA256], ref


def test_a_damaged_score_table_names_the_command_that_trains_its_group_again(
        tmp_path, capsys, score_table):
    text = score_table.read_text()
    score_table.write_text(text.replace(",0.", ",0.1", 1))
    _refused(_audit(score_table, tmp_path / "fig2.csv"), capsys, score_table,
             "its rows do not match the content hash", score_table.parent)
    # an absolute path is no output of the workflow's (a reference table): no command
    code, err = _run(_audit(score_table.resolve(), tmp_path / "fig2.csv"), capsys)
    assert code == 2 and "content hash" in err[-1] and "redo it" not in err[-1], err
    # its last row cut and its hash recomputed (an edit that knows the format): its rows
    # per side
    head, body = (text.rsplit("\n", 2)[0] + "\n").split("\n", 1)
    meta = json.loads(head.split(": ", 1)[1])
    meta[BODY_SHA256] = hashlib.sha256(body.encode()).hexdigest()
    score_table.write_text(f"{head.split(': ', 1)[0]}: {json.dumps(meta)}\n{body}")
    _refused(_audit(score_table, tmp_path / "fig2.csv"), capsys, score_table,
             "side k2: 3 rows, but its provenance records 4 trials", score_table.parent)


# -- kept blocks ---------------------------------------------------------------------------

def test_a_kept_block_replaced_by_a_folder_stops_the_job_in_one_line(tmp_path, capsys,
                                                                      score_table):
    block = next((tmp_path / "kept").glob("k1_*.csv"))
    block.unlink()
    block.mkdir()
    (block / "something").write_text("kept by hand")
    code, err = _run(["jagielski-train", "--task", tmp_path / "task.npz", "--dataset",
                      "fmnist", "--arch", "fnn", "--attack", "clipbkd", "--cells",
                      json.dumps([[1, "g2", "4"]]), "--spec", json.dumps(TRAIN_SPEC),
                      "--seed", "5", "--out-dir", tmp_path / "again", "--device", "cpu",
                      "--store", tmp_path / "kept"], capsys)
    assert code == 2 and err[-1] == (
        f"dpaudit jagielski-train: bad input file {block}: a folder where a kept block is "
        "written: move or remove it, then rerun"), err
    assert "restored" not in "".join(err)  # before any model is trained
    assert not (tmp_path / "again").exists() and (block / "something").exists()

    # the store of Tramer et al.'s audits, the one-run and Abadi audits: the same
    side, key = trials.Side("runs", [1, 2]), {"k": 1}
    trials.keep(tmp_path / "store", key, side, 0, [1, 2], {"loss": [0.5, 1.5]})
    kept = next((tmp_path / "store").glob("*.csv"))
    kept.unlink()
    kept.mkdir()
    with pytest.raises(BadInputFile, match="a folder where a kept block is written"):
        trials.kept(tmp_path / "store", key, side, 0, [1, 2])


def test_the_hash_covers_every_array_and_value_by_name():
    """content_digest: the same content gives the same digest (torch or numpy, any memory
    layout); any value, name, dtype or nesting changed gives another."""
    from dpaudit.io import content_digest

    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    base = content_digest({"W": [torch.from_numpy(a)], "model": {"arch": "lr"}})
    assert base == content_digest({"W": [np.asfortranarray(a)], "model": {"arch": "lr"}})
    others = [{"W": [a + 1e-7], "model": {"arch": "lr"}},
              {"W": [a.astype(np.float64)], "model": {"arch": "lr"}},
              {"W": [a.reshape(4, 3)], "model": {"arch": "lr"}},
              {"V": [a], "model": {"arch": "lr"}},
              {"W": [a], "model": {"arch": "fnn"}},
              {"W": a, "model": {"arch": "lr"}}]
    assert len({base, *map(content_digest, others)}) == 1 + len(others)


def test_an_npz_written_by_save_features_reads_back_what_was_saved(tmp_path):
    arrays = {"X": np.random.default_rng(0).random((5, 3)), "y": np.arange(5), "y_p": 1}
    features.save_features(tmp_path / "f.npz", arrays, {"seed": 3})
    back, prov = features.load_features(tmp_path / "f.npz", ["X"])
    assert prov == {"seed": 3} and sorted(back) == ["X", "y", "y_p"]
    assert all(np.array_equal(back[k], arrays[k]) for k in arrays)
    with zipfile.ZipFile(tmp_path / "f.npz") as z:
        assert f"{CONTENT_SHA256}.npy" in z.namelist()
