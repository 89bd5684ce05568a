"""Text that goes stale unless a test keeps it true: each package's list of its modules, the
job-size table of docs/scale.md against the rules that size their jobs, and docstrings that
say what and why (measured numbers live in docs/, checked against kept tables by
tests/test_docs_numbers.py)."""

from __future__ import annotations

import ast
import fnmatch
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "dpaudit"


def _docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text())) or ""


def _members(package: Path) -> list[str]:
    """The modules and subpackages of ``package`` (a folder), by name."""
    return sorted(p.stem for p in package.glob("*.py") if p.stem != "__init__") + sorted(
        p.name for p in package.iterdir() if (p / "__init__.py").is_file())


def _listed(doc: str, package: str) -> set[str]:
    """The members a package docstring names: ``:mod:`.x``` or ``:mod:`dpaudit.pkg.x```."""
    names = re.findall(r":mod:`([\w.]+)`", doc)
    return {n.rpartition(".")[2] for n in names
            if n.startswith(".") or n.startswith(package + ".")
            and n.count(".") == package.count(".") + 1}


def test_every_package_that_lists_its_modules_lists_all_of_them():
    """A package whose docstring lists its modules (``:mod:``) names every one, so the list
    a newcomer reads is the package. `plots` and `cli` list none: one module per figure or
    subcommand, named after it."""
    listing = 0
    for init in sorted(PACKAGE.rglob("__init__.py")):
        package = ".".join(init.parent.relative_to(PACKAGE.parent).parts)
        listed = _listed(_docstring(init), package)
        if listed:
            listing += 1
            missing = sorted(set(_members(init.parent)) - listed)
            assert not missing, f"{package}'s docstring does not name {missing}"
    assert listing >= 7  # dpaudit, experiments, bounds, dpsgd, adapters, tight, tramer, ...


def test_the_module_list_check_sees_a_missing_module():
    doc = _docstring(PACKAGE / "experiments" / "__init__.py")
    listed = _listed(doc, "dpaudit.experiments")
    assert {"tight", "shuffle", "abadi", "checks"} <= listed
    assert "tight" not in _listed(doc.replace(":mod:`.tight`", "tight"), "dpaudit.experiments")
    assert _listed(":mod:`dpaudit.bounds` :mod:`dpaudit.bounds.gdp`", "dpaudit") == {"bounds"}


#: A timing or a rate in a docstring: a number with a unit of time, or "per second".
TIMING = re.compile(r"\b\d+(?:\.\d+)?\s?(?:ms|s|seconds?|min|minutes?|h|hours?)\b(?!['\w])"
                    r"|\b(?:runs|models|model-steps|steps|rows)/s\b")


def _docstrings(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc:
                yield getattr(node, "name", path.stem), doc


def test_docstrings_carry_no_timings():
    """Docstrings say what and why; a measured time or speed goes to docs/ (docs/scale.md),
    where the measurement is said with its machine and load."""
    found = [(str(path.relative_to(ROOT)), name, m.group())
             for path in sorted(PACKAGE.rglob("*.py"))
             for name, doc in _docstrings(path) for m in TIMING.finditer(doc)]
    assert not found, found
    assert TIMING.search("about 1.5 s, which") and TIMING.search("287.4 runs/s")
    assert not TIMING.search("truncated to [-2 s', 2 s']")


def _job_rules() -> set[str]:
    """The rules of workflow/rules/ whose resources come from `job(...)` (common.smk)."""
    rules = set()
    for smk in (ROOT / "workflow" / "rules").glob("*.smk"):
        for block in re.split(r"^(?=rule |use rule )", smk.read_text(), flags=re.M):
            head = re.match(r"rule (\w+):", block)
            if head and "**job(" in block:
                rules.add(head.group(1))
    return rules


def test_the_job_size_table_has_every_rule_that_sizes_its_jobs():
    """docs/scale.md's job-size table ("Job sizes") has a row for every rule whose cluster
    resources `job(...)` computes from measured speeds, and no row for a rule that has none."""
    text = (ROOT / "docs" / "scale.md").read_text()
    section = text.split("### Job sizes", 1)[1].split("\n###", 1)[0]
    table = next(t for t in re.findall(r"((?:^\|.*\n)+)", section, re.M)
                 if t.startswith("| rule |"))
    named = [n for row in table.splitlines()[2:] for n in re.findall(r"`([\w*]+)`",
                                                                      row.split("|")[1])]
    rules = _job_rules()
    assert {"shuffle_audit", "abadi_features", "abadi_train", "jagielski_train"} <= rules
    missing = sorted(r for r in rules if not any(fnmatch.fnmatch(r, n) for n in named))
    assert not missing, f"docs/scale.md's job-size table lacks {missing}"
    unknown = sorted(n for n in named if not fnmatch.filter(rules, n))
    assert not unknown, f"docs/scale.md's job-size table has rows for no such rule: {unknown}"
