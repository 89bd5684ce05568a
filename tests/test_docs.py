"""The documentation: the generated config reference, schema descriptions, the README's
size and CI command, links between pages, and citations by author rather than by file."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
SCHEMA = ROOT / "src" / "dpaudit" / "schema.yaml"
CONFIG_REFERENCE = ROOT / "config" / "README.md"
CI = ROOT / ".ci" / "run"
CI_MARKER = "# --- the README's test command, verbatim ---"
README_MAX_LINES = 220


def schema_keys(node: dict, prefix: str = "") -> list[str]:
    """Dotted paths of every key under ``node``'s ``properties``, recursively."""
    return list(dict.fromkeys(path for path, _ in schema_nodes(node, prefix)))


def schema_nodes(node: dict, prefix: str = ""):
    """``(dotted path, schema node)`` of every key under ``node``'s ``properties``.

    Anchors and aliases are already resolved by ``yaml.safe_load``. The walk also follows
    ``items`` (arrays of objects) and the branches of ``allOf``/``anyOf``/``oneOf``. Both
    kinds keep the path.
    """
    if not isinstance(node, dict):
        return
    for name, sub in (node.get("properties") or {}).items():
        path = f"{prefix}.{name}" if prefix else name
        yield path, sub
        yield from schema_nodes(sub, path)
    if isinstance(node.get("items"), dict):
        yield from schema_nodes(node["items"], prefix)
    for combinator in ("allOf", "anyOf", "oneOf"):
        for branch in node.get(combinator) or []:
            yield from schema_nodes(branch, prefix)


def _schema() -> dict:
    return yaml.safe_load(SCHEMA.read_text())


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _without_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped (letters,
    digits, spaces, hyphens and underscores kept), spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for line in _without_code_blocks(page.read_text()).splitlines():
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            slug = _slug(match.group(1))
            anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


# ---- the config reference --------------------------------------------------------------

def test_schema_walk_sees_nested_and_aliased_keys():
    keys = schema_keys(_schema())
    for key in ("seed", "hw3.grids.eps.m", "hw3.grids.d.d", "accounting.composition.num_k",
                "tramer.model.lr", "tramer.user.spec", "tramer.user.val_runs",
                "jagielski.datasets.cifar.noise", "jagielski.datasets.cifar.pretrain_images"):
        assert key in keys, key


def test_config_reference_is_generated_from_the_schema_and_current():
    from dpaudit.config import reference_markdown

    assert CONFIG_REFERENCE.read_text() == reference_markdown(), (
        "config/README.md is out of date: run `python -m dpaudit.config > config/README.md`")


def test_every_schema_key_has_a_description():
    schema = _schema()
    assert str(schema.get("description", "")).strip(), "the schema has no top-level description"
    assert "config/README.md" in schema["description"], "the schema should point to config/README.md"
    nodes = list(schema_nodes(schema))
    assert nodes, f"no keys found in {SCHEMA}"
    missing = [path for path, node in nodes if not str(node.get("description", "")).strip()]
    assert not missing, f"schema keys without a description: {missing}"


def test_quick_config_is_an_overlay_of_only_the_keys_that_change():
    full = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    quick = yaml.safe_load((ROOT / "config" / "quick.yaml").read_text())

    def leaves(node, prefix=()):
        for key, value in node.items():
            if isinstance(value, dict):
                yield from leaves(value, (*prefix, key))
            else:
                yield (*prefix, key), value

    for path, value in leaves(quick):
        base = full
        for key in path:
            assert isinstance(base, dict) and key in base, (
                f"config/quick.yaml sets {'.'.join(path)}, which config/config.yaml lacks")
            base = base[key]
        assert base != value, (f"config/quick.yaml repeats {'.'.join(path)} = {value!r} "
                               "from config/config.yaml: an overlay holds only what changes")


# ---- README and docs -------------------------------------------------------------------

def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move details to docs/")


def test_readme_contains_the_ci_test_command_verbatim():
    ci_lines = CI.read_text().splitlines()
    assert CI_MARKER in ci_lines, f"{CI} lacks the marker line {CI_MARKER!r}"
    following = ci_lines[ci_lines.index(CI_MARKER) + 1:]
    command = next((line.strip() for line in following if line.strip()), "")
    assert command, f"no command after the marker in {CI}"
    text = README.read_text()
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)
    assert any(command in block for block in blocks), (
        f"README.md has no code block containing the CI test command {command!r}")


def test_readme_names_every_named_target():
    """A rule without outputs (other than `all`) is a target a user types: the README's
    list of named targets holds each one."""
    text = "\n".join(p.read_text() for p in sorted((ROOT / "workflow" / "rules").glob("*.smk")))
    rules = re.findall(r"^rule (\w+):\n(.*?)(?=^\S|\Z)", text, flags=re.S | re.M)
    targets = {name for name, body in rules if not re.search(r"^    output:", body, re.M)}
    assert {"tramer", "trials_needed"} <= targets
    named = README.read_text().split("Named targets:")[1].split("--configfile")[0]
    assert not {t for t in targets if f"`{t}`" not in named}, named


def test_docs_have_no_unfilled_placeholders():
    leftover = [f"{page.name}: {line.strip()}" for page in _pages()
                for line in page.read_text().splitlines()
                if re.fullmatch(r"[A-Z_]*PLACEHOLDER", line.strip())]
    assert not leftover, leftover


def test_relative_links_in_readme_and_docs_point_to_existing_files_and_headings():
    broken = []
    for page in _pages():
        text = _without_code_blocks(page.read_text())
        for target in re.findall(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target, flags=re.I):  # http:, mailto:, ...
                continue
            path, _, fragment = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif fragment and dest.suffix == ".md" and fragment not in _anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_doc_images_are_small():
    big = [f"{path.relative_to(ROOT)}: {path.stat().st_size // 1024} KiB"
           for path in sorted((DOCS / "img").glob("*")) if path.stat().st_size > 150 * 1024]
    assert not big, f"images over 150 KiB (downscale them): {big}"


def test_docs_cite_by_author_not_by_input_file_or_issue():
    """Sources are cited by author and year (docs/references.md), never as the project's
    input files ("seed 003") or its issue numbers ("issue 2 s.5")."""
    pattern = re.compile(r"seed 00[0-9]|issue #?[0-9]+", flags=re.I)
    texts = {page.relative_to(ROOT): page.read_text() for page in _pages()}
    texts.update({path.relative_to(ROOT): path.read_text()
                  for path in (CONFIG_REFERENCE, ROOT / "config" / "config.yaml",
                               ROOT / "config" / "quick.yaml", SCHEMA)})
    found = [f"{name}: {match.group(0)!r}" for name, text in texts.items()
             for match in pattern.finditer(text)]
    assert not found, found


def test_readme_audit_example_runs_and_gives_the_verdict_it_explains(tmp_path, monkeypatch,
                                                                     capsys):
    """The README's "Audit your own DP-SGD" command, verbatim but for fewer runs, on a
    function of its contract that adds no noise: the audit runs and prints the verdict the
    README explains."""
    import shlex

    import torch

    from dpaudit.cli import main

    block = README.read_text().split("## Audit your own DP-SGD")[1].split("```bash\n")[1]
    block = block.split("```")[0]
    signature, command, verdict = block.strip().splitlines()
    assert "def train(X, y, seeds, spec)" in signature
    env, program, *argv = shlex.split(command)
    assert (env, program) == ("PYTHONPATH=.", "dpaudit") and argv[0] == "audit-impl"
    assert argv[argv.index("--train") + 1] == "my_dpsgd:train"
    argv[argv.index("--runs") + 1] = "100"  # the fewest at eps 1 is 76
    argv[argv.index("--out") + 1] = str(tmp_path / "my_audit.csv")
    (tmp_path / "my_dpsgd.py").write_text(
        "import torch\n\n"
        "def train(X, y, seeds, spec):  # one gradient step from a seeded init, no noise\n"
        "    g = (X[:, :, None] * (0.5 - torch.nn.functional.one_hot(y, spec['n_classes'])"
        ")[:, None, :]).sum(0)\n"
        "    W = torch.stack([torch.randn(g.shape, generator=torch.Generator().manual_seed(s))"
        " * 1e-3 - g for s in seeds])\n"
        "    return lambda x: x @ W\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    y = torch.arange(100) % 2
    X = (torch.randn(100, 784, generator=torch.Generator().manual_seed(0))
         + (2 * y[:, None] - 1) * 0.2)  # two classes a linear model tells apart
    monkeypatch.setattr("dpaudit.data.load_fmnist",
                        lambda root, classes, **kw: (X.numpy(), y.numpy()))
    assert main([*argv, "--val-runs", "10", "--n-train", "100"]) == 0
    said = re.search(r'"([a-z ]+)"', verdict).group(1)
    assert said == "violates its claimed guarantee" and f": {said};" in capsys.readouterr().err
    assert "no violation detected" in verdict
