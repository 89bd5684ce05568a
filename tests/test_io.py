"""Result tables (:mod:`dpaudit.io`): what is read back is what was written, bit for bit."""

import hashlib
import importlib
import sys

import numpy as np
import pytest
import pandas as pd

from dpaudit.io import read_provenance, read_table, source_digest, write_table

# Scores of a CUDA run whose kept blocks, read back by pandas 2.2's default float parser,
# were restored one unit in the last place off (0.35300683975219727 -> 0.3530068397521972).
INEXACT_BEFORE = [0.35300683975219727, 0.9106752872467041, -0.39975765347480774,
                  -0.07347139716148376, 1.9448109865188599, 1.1450362801551819,
                  -0.12651649117469788, 0.9035544395446777]


def test_floats_read_back_exactly_and_a_table_written_again_keeps_its_bytes(tmp_path):
    """A restore reads kept blocks and writes them into the job's outputs: the same bytes
    as the table trained in one go, on any pandas. The values need an exact parser (with
    pandas 2.2's default, all eight of the first and a third of the random ones come back
    off by one unit in the last place)."""
    rng = np.random.default_rng(0)
    x = np.concatenate([INEXACT_BEFORE, rng.normal(size=3000), 1e-7 * rng.normal(size=300),
                        1e6 * rng.uniform(size=300), [np.pi, 1 / 3, -0.0, 5e-324, 1e308]])
    df = pd.DataFrame({"trial": np.arange(len(x)), "score": x,  # and float32 accuracies:
                       "f32": rng.random(len(x)).astype(np.float32).astype(np.float64)})
    write_table(df, tmp_path / "a.csv", {"seed": 5, "spec": {"trials": len(x)}})
    back, meta = read_table(tmp_path / "a.csv")
    assert meta == read_provenance(tmp_path / "a.csv")
    assert meta["seed"] == 5 and meta["spec"] == {"trials": len(x)}
    for col in ("score", "f32"):
        assert back[col].dtype == np.float64
        bits = back[col].to_numpy().view(np.int64), df[col].to_numpy().view(np.int64)
        wrong = np.flatnonzero(bits[0] != bits[1])
        assert wrong.size == 0, (f"{col}: {wrong.size} values read back inexactly, e.g. "
                                 f"{df[col].iloc[wrong[0]]!r} -> {back[col].iloc[wrong[0]]!r}")
    write_table(back, tmp_path / "b.csv", meta)
    assert (tmp_path / "b.csv").read_bytes() == (tmp_path / "a.csv").read_bytes()


@pytest.mark.parametrize("version, options", [
    ("2.2.3", {"float_precision": "round_trip"}), ("3.0.1", {"float_precision": "round_trip"}),
    ("3.1.0", {}), ("3.1.0rc1", {}), ("4.0.0", {})])
def test_tables_are_read_with_the_exact_float_parser_before_pandas_3_1(tmp_path, monkeypatch,
                                                                       version, options):
    """The float parser read_table asks pandas for, by version: on pandas >= 3.1 every
    parser is exact, so the round trip above cannot tell whether older ones get
    "round_trip"; this checks the options passed."""
    write_table(pd.DataFrame({"x": [0.1]}), tmp_path / "t.csv", {"seed": 0})
    calls, read_csv = [], pd.read_csv
    monkeypatch.setattr(pd, "__version__", version)
    monkeypatch.setattr(pd, "read_csv", lambda *a, **kw: calls.append(kw) or read_csv(*a))
    read_table(tmp_path / "t.csv")
    assert calls == [options]


def test_source_digest_of_a_package_covers_every_module_in_name_order(tmp_path, monkeypatch):
    """A package's own source is only its __init__: its digest is that of all its modules,
    sorted by name, so an edit to any of them (here the second) is a new digest; a plain
    module's digest is that of its source. The modules are read, not imported: one that
    needs a library absent here (an optional one) still counts, and is not imported."""
    pkg = tmp_path / "digestpkg"
    pkg.mkdir()
    files = {"__init__.py": '"""Three modules."""\nfrom .b import g\n',
             "b.py": "def g():\n    return 2\n", "a.py": "def f():\n    return 1\n",
             "c.py": "import dpaudit_no_such_library\n"}
    for name, text in files.items():
        (pkg / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        mod = importlib.import_module("digestpkg")
        want = hashlib.sha256("".join(f"{name}\n{files[file]}" for name, file in (
            ("digestpkg", "__init__.py"), ("digestpkg.a", "a.py"), ("digestpkg.b", "b.py"),
            ("digestpkg.c", "c.py"))).encode()).hexdigest()
        assert source_digest(mod) == want
        assert "digestpkg.a" not in sys.modules and "digestpkg.c" not in sys.modules
        (pkg / "b.py").write_text("def g():\n    return 20\n")
        assert source_digest(mod) != want
        plain = importlib.import_module("digestpkg.a")
        assert source_digest(plain) == hashlib.sha256(files["a.py"].encode()).hexdigest()
    finally:
        for name in ("digestpkg", "digestpkg.a", "digestpkg.b", "digestpkg.c"):
            sys.modules.pop(name, None)


def test_the_trainers_digest_needs_no_numba(monkeypatch):
    """The trainer's digest (its kept runs' key) reads dpaudit.dpsgd's modules: where numba
    is absent (the compiled draws then fall back to torch operations) it is the same
    digest, and nothing fails."""
    from dpaudit import dpsgd
    from dpaudit.experiments.tight import whitebox

    want = whitebox.trainer_digest()
    monkeypatch.setitem(sys.modules, "numba", None)  # import numba fails
    monkeypatch.delitem(sys.modules, "dpaudit.dpsgd.cpu_draws", raising=False)
    monkeypatch.delattr(dpsgd, "cpu_draws", raising=False)
    assert whitebox.trainer_digest() == want
