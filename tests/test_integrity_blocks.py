"""Kept blocks, score tables and result tables are never trusted blindly: a truncated or
altered file is trained again (a kept block) or refused naming the file (a table a bound
or a figure reads), and an intact one is restored byte for byte."""

import json

import numpy as np
import pandas as pd
import pytest

from dpaudit import dpsgd
from dpaudit.experiments import jagielski
from dpaudit.io import BODY_SHA256, BadInputFile, read_table, write_table
from test_jagielski import TRAIN_SPEC, _task, _train_cli

BLOCK = "k1_000000-000008.csv"


def _group(store, msgs=None):
    """A two-cell ClipBKD group, 8 trials per side in one block: 16 rows per kept block."""
    task = _task(np.random.default_rng(3))
    base = dict(epochs=2, batch_size=10, lr=0.5)
    cfgs = {"a": dpsgd.DPSGDConfig(clip=1.0, noise_multiplier=0.5, **base),
            "b": dpsgd.DPSGDConfig(clip=2.0, noise_multiplier=0.0, **base)}
    return jagielski.run_group(task, "clipbkd", dpsgd.ModelSpec("lr", 6), cfgs, ks=[1],
                               trials=8, seed=0, name=("toy", "lr"),
                               calls=jagielski.Calls(8, "cpu",
                                                     log=None if msgs is None else msgs.append),
                               store=jagielski.Store(store, {"k": 1}))


def _summary(msgs):
    return next(m for m in msgs if "restored" in m)


def _edit_field(text: str, line: int, column: str, value: str) -> str:
    """``text`` (a table file) with ``column`` of its ``line``-th row set to ``value``."""
    lines = text.split("\n")
    col = lines[1].split(",").index(column)
    fields = lines[2 + line].split(",")
    fields[col] = value
    lines[2 + line] = ",".join(fields)
    return "\n".join(lines)


def _rehashed(text: str) -> str:
    """``text`` (a table file) with its recorded hash made that of its rows again, as an
    edit that recomputes it would leave it."""
    import hashlib
    import json

    head, body = text.split("\n", 1)
    prefix, meta = head.split(" ", 2)[:2], json.loads(head.split(" ", 2)[2])
    meta[BODY_SHA256] = hashlib.sha256(body.encode()).hexdigest()
    return " ".join([*prefix, json.dumps(meta, sort_keys=True)]) + "\n" + body


TAMPER = {
    "cut_by_10_lines": lambda t: "\n".join(t.split("\n")[:-11]) + "\n",
    "cut_mid_line": lambda t: t[:-12],
    "edited_score": lambda t: _edit_field(t, 3, "clipbkd", "0.25"),
    "text_in_a_score": lambda t: _edit_field(t, 3, "clipbkd", "oops"),
    "no_hash_recorded": lambda t: t.replace(f'"{BODY_SHA256}"', '"was_hash"'),
}


@pytest.mark.parametrize("how", sorted(TAMPER))
def test_a_damaged_kept_block_is_trained_again_and_named(tmp_path, how):
    first = _group(tmp_path)
    written = {f.name: f.read_bytes() for f in tmp_path.iterdir()}
    block = tmp_path / BLOCK
    block.write_text(TAMPER[how](block.read_text()))
    msgs = []
    again = _group(tmp_path, msgs)
    named = [m for m in msgs if str(block) in m]
    assert len(named) == 1 and named[0].endswith("training it again"), msgs
    assert "16 models restored, 16 to train" in _summary(msgs)  # the other side's is intact
    for c in first:
        pd.testing.assert_frame_equal(again[c], first[c], check_exact=True)
    assert {f.name: f.read_bytes() for f in tmp_path.iterdir()} == written


def test_an_intact_store_restores_byte_for_byte_after_an_interruption(tmp_path):
    """An interrupted job never leaves a block half-written (atomic writes): the rerun
    restores every block it finds, silently, and writes the same bytes."""
    first = _group(tmp_path)
    written = {f.name: f.read_bytes() for f in tmp_path.iterdir()}
    (tmp_path / BLOCK).unlink()
    msgs = []
    again = _group(tmp_path, msgs)
    assert "16 models restored, 16 to train" in _summary(msgs)
    assert not [m for m in msgs if "training it again" in m]
    msgs.clear()
    _group(tmp_path, msgs)
    assert "32 models restored, 0 to train" in _summary(msgs)
    for c in first:
        pd.testing.assert_frame_equal(again[c], first[c], check_exact=True)
    assert {f.name: f.read_bytes() for f in tmp_path.iterdir()} == written


def test_score_columns_are_what_score_models_gives():
    task = _task(np.random.default_rng(0))
    model = dpsgd.ModelSpec("lr", 6)
    params = dpsgd.init_params(model, 2, [1, 2], device="cpu")
    for attack in jagielski.ATTACKS:
        got = jagielski.score_models(params, model, task, attack)
        assert tuple(got) == jagielski.score_columns(attack)


def _refused(argv, capsys, path, reason):
    """``argv`` stops on ``path``: BadInputFile, or the CLI's one-line report of it."""
    from dpaudit.cli import main

    try:
        rc = main(argv)
    except BadInputFile as exc:
        assert exc.path == str(path) and reason in exc.reason, exc
        return
    err = capsys.readouterr().err
    assert rc != 0 and str(path) in err and reason in err, err


AUDIT = {"alpha": 0.05, "delta": 1e-5, "select_frac": 0.5, "trials": 8}


def _audit_argv(scores, out):
    return ["jagielski-audit", "--experiment", "fig2", "--scores", str(scores), "--spec",
            json.dumps(AUDIT), "--seed", "0", "--out", str(out)]


@pytest.fixture
def score_table(tmp_path):
    from dpaudit import features

    features.save_features(tmp_path / "task.npz", _task(np.random.default_rng(7)).arrays(),
                           {"dataset": "toy"})
    assert _train_cli(tmp_path, {**TRAIN_SPEC, "trials": 8}, [[1, "g2", "4"]]) == 0
    return tmp_path / "out" / "c1_g2_e4.csv"  # 3 sides x 8 trials


def test_a_truncated_score_table_is_refused_naming_it(tmp_path, capsys, score_table):
    from dpaudit.cli import main

    assert main(_audit_argv(score_table, tmp_path / "fig2.csv")) == 0
    assert read_table(tmp_path / "fig2.csv")[0].trials.tolist() == [8]
    text = score_table.read_text()
    cut = "\n".join(text.split("\n")[:-11]) + "\n"  # the last 10 rows
    score_table.write_text(cut)
    out = tmp_path / "cut.csv"
    _refused(_audit_argv(score_table, out), capsys, score_table, "content hash")
    # its hash recomputed after the cut: the rows per side
    score_table.write_text(_rehashed(cut))
    _refused(_audit_argv(score_table, out), capsys, score_table,
             "side k1: 6 rows, but its provenance records 8 trials per side")
    assert not out.exists()
    with pytest.raises(BadInputFile, match="side k1: 6 rows"):
        jagielski.read_scores(score_table)


def test_an_edited_result_table_is_not_plotted(tmp_path, capsys, score_table):
    from dpaudit.cli import main
    from dpaudit.plots.jagielski import plot_fig2

    fig2 = tmp_path / "fig2.csv"
    assert main(_audit_argv(score_table, fig2)) == 0
    table = jagielski.read_result_table(fig2)
    assert len(table) == 1
    fig2.write_text(_edit_field(fig2.read_text(), 0, "eps_lb", "3.5"))
    with pytest.raises(BadInputFile, match="content hash"):
        plot_fig2(fig2, tmp_path / "fig2.pdf")
    assert not (tmp_path / "fig2.pdf").exists()
    _refused(["jagielski-plot", "--experiment", "fig2", "--table", str(fig2), "--out",
              str(tmp_path / "f.pdf")], capsys, fig2, "content hash")
    # a table whose hash matches its rows (recomputed after an edit) is read, but only
    # with the trials its provenance records
    write_table(table.assign(trials=6), fig2, {"spec": AUDIT})
    with pytest.raises(BadInputFile, match=r"rows of trials \[6\], but its provenance records 8"):
        plot_fig2(fig2, tmp_path / "fig2.pdf")


def test_a_damaged_block_of_the_trials_store_is_named_and_not_restored(tmp_path, capsys):
    """dpaudit.trials (Tramer et al.'s audits, the one-run and Abadi stores): a kept block
    cut short is not restored, and one line names it; a block that was never kept is
    simply absent."""
    from dpaudit import trials

    side, key, seeds = trials.Side("evaluation runs with canary", [5, 6, 7, 8]), {"k": 1}, [5, 6, 7, 8]
    assert trials.kept(tmp_path, key, side, 0, seeds) is None
    assert capsys.readouterr().err == ""
    trials.keep(tmp_path, key, side, 0, seeds, {"loss": [0.5, 1.5, 2.5, 3.5]})
    assert trials.kept(tmp_path, key, side, 0, seeds)["loss"].tolist() == [0.5, 1.5, 2.5, 3.5]
    path = next(tmp_path.glob("*.csv"))
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]))
    assert trials.kept(tmp_path, key, side, 0, seeds) is None
    err = capsys.readouterr().err
    assert f"kept block {path}: " in err and "training it again" in err
