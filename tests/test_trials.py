"""The trials loop: batching, bookkeeping, and batches kept for a rerun."""

import numpy as np
import pandas as pd
import pytest

from dpaudit import trials
from dpaudit.trials import Side


def _sides():
    return [Side("runs with canary", [11, 12, 13, 14, 15], {"canary_in": True}),
            Side("runs without", [21, 22, 23], {"canary_in": False})]


def _recording(calls):
    def train_score(side, start, chunk):
        assert list(side.seeds[start:start + len(chunk)]) == list(chunk)
        calls.append((side.name, list(chunk)))
        rng = np.random.default_rng(chunk[0])  # a batch's numbers depend on its seeds only
        return {"loss": rng.normal(size=len(chunk)) * 1e-3,
                "log_prob": list(rng.normal(size=(len(chunk), 3)) * 1e5)}
    return train_score


def _same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(a.drop(columns="log_prob"), b.drop(columns="log_prob"),
                                  check_exact=True)
    np.testing.assert_array_equal(np.stack(a.log_prob), np.stack(b.log_prob))


def test_rows_carry_the_side_trial_and_seed():
    calls = []
    out = trials.run(_sides(), _recording(calls), 2)
    assert [len(c) for _, c in calls] == [2, 2, 1, 2, 1]
    assert out.trial.tolist() == [0, 1, 2, 3, 4, 0, 1, 2]
    assert out.seed.tolist() == [11, 12, 13, 14, 15, 21, 22, 23]
    assert out.canary_in.tolist() == [True] * 5 + [False] * 3
    with pytest.raises(ValueError, match="batch=0: must be >= 1"):
        trials.run(_sides(), _recording(calls), 0)


def test_kept_batches_restore_bit_for_bit_and_only_under_their_key(tmp_path):
    """A rerun restores every kept batch (the same numbers, vectors included) without
    training; a lost batch (an interrupted job) trains alone; another key, or other batch
    boundaries, train again."""
    calls, msgs = [], []
    first = trials.run(_sides(), _recording(calls), 2, store=tmp_path, key={"spec": 1})
    assert len(calls) == 5 and len(list(tmp_path.iterdir())) == 5
    plain = trials.run(_sides(), _recording([]), 2)
    _same(first, plain)
    calls.clear()
    again = trials.run(_sides(), _recording(calls), 2, log=msgs.append, store=tmp_path,
                       key={"spec": 1})
    assert calls == [] and "8 models restored, 0 to train" in msgs[0]
    _same(again, first)
    (tmp_path / "runs_with_canary_000002-000004.csv").unlink()
    again = trials.run(_sides(), _recording(calls), 2, store=tmp_path, key={"spec": 1})
    assert calls == [("runs with canary", [13, 14])]
    _same(again, first)
    calls.clear()
    trials.run(_sides(), _recording(calls), 2, store=tmp_path, key={"spec": 2})
    assert len(calls) == 5
    calls.clear()
    trials.run(_sides(), _recording(calls), 3, store=tmp_path, key={"spec": 2})
    assert len(calls) == 3
    with pytest.raises(ValueError, match="statistic 'bad': one value or one vector per model"):
        trials.keep(tmp_path, {}, _sides()[0], 0, [1, 2], {"bad": [[[1.0]], [[2.0]]]})


PREFIX = "# dpaudit-provenance: "


@pytest.mark.parametrize("meta_edit, body_edit, rehash, reason", [
    # the header lists a statistic the rows lack (and not one they have), hash intact
    (lambda m: m["stats"].update(lost=m["stats"].pop("loss")), None, True,
     "its columns or trials are not those its header lists"),
    (None, lambda b: b.replace("\n0,11,", "\n1,11,", 1), True,
     "its columns or trials are not those its header lists"),
    (lambda m: m.pop("body_sha256"), None, False, "no content hash recorded"),
    (None, lambda b: b[:-40], False, "do not match the content hash"),
])
def test_a_damaged_kept_batch_is_named_and_trained_again(tmp_path, capsys, meta_edit,
                                                        body_edit, rehash, reason):
    import hashlib
    import json

    calls = []
    first = trials.run(_sides(), _recording(calls), 2, store=tmp_path, key={"spec": 1})
    path = tmp_path / "runs_with_canary_000000-000002.csv"
    head, body = path.read_text().split("\n", 1)
    meta = json.loads(head[len(PREFIX):])
    if meta_edit:
        meta_edit(meta)
    if body_edit:
        body = body_edit("\n" + body)[1:]
    if rehash:  # a consistent content hash: only what the header lists is wrong
        meta["body_sha256"] = hashlib.sha256(body.encode()).hexdigest()
    path.write_text(PREFIX + json.dumps(meta) + "\n" + body)
    calls.clear()
    again = trials.run(_sides(), _recording(calls), 2, store=tmp_path, key={"spec": 1})
    assert calls == [("runs with canary", [11, 12])]
    err = capsys.readouterr().err
    assert f"kept block {path}: " in err and reason in err, err
    _same(again, first)


def test_a_store_that_is_a_file_is_refused_before_training(tmp_path):
    (tmp_path / "store").write_text("")
    with pytest.raises(ValueError, match="store=.*store: not a folder"):
        trials.run(_sides(), _recording([]), 2, store=tmp_path / "store")
