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
