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
#: The marker lines in .ci/run before the README's two commands, in this order.
CI_MARKERS = ("# --- the README's install command, verbatim ---",
              "# --- the README's test command, verbatim ---")
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


def test_readme_contains_the_ci_commands_verbatim():
    """.ci/run runs the README's install command (beside its apt installs) and then its test
    command, each the line after its marker; one code block of the README holds both, in
    that order."""
    ci_lines = CI.read_text().splitlines()
    commands = []
    for marker in CI_MARKERS:
        assert marker in ci_lines, f"{CI} lacks the marker line {marker!r}"
        following = ci_lines[ci_lines.index(marker) + 1:]
        command = next((line.strip() for line in following if line.strip()), "")
        assert command, f"no command after the marker {marker!r} in {CI}"
        commands.append(command)
    assert ci_lines.index(CI_MARKERS[0]) < ci_lines.index(CI_MARKERS[1])
    text = README.read_text()
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)
    assert any([line.strip() for line in block.splitlines()] == commands for block in blocks), (
        f"README.md has no code block of the CI commands {commands!r}, one a line")


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


def _code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.S | re.M)


def _section(page: Path, heading: str) -> str:
    """The text of ``page`` from ``heading`` (a whole heading line) to the next heading of
    the same or a higher level (a ``#`` line inside a code block is no heading)."""
    level, lines, fenced = len(heading.split(" ")[0]), None, False
    for line in page.read_text().splitlines(keepends=True):
        fenced ^= line.startswith("```")
        if lines is None:
            lines = [] if line.rstrip("\n") == heading else None
        elif not fenced and re.match(rf"#{{1,{level}}} ", line):
            break
        else:
            lines.append(line)
    assert lines is not None, f"{page.name} has no heading {heading!r}"
    return "".join(lines)


def _own_code_example() -> tuple[str, str, str]:
    """The README's own-code block (its three lines: the file, the command, the verdict),
    after checking that its command is the docs' (Command line) and the file is the docs'
    example; the example's code."""
    signature, command, verdict = _code_blocks(
        _section(README, "## Audit your own DP-SGD"), "bash")[0].strip().splitlines()
    guide = DOCS / "audit_your_implementation.md"
    docs_block = _code_blocks(_section(guide, "## Command line"), "bash")[0]
    docs_command = " ".join(re.match(r"[^\n]*?(?:\\\n[^\n]*?)*(?=\n|$)", docs_block)
                            .group(0).replace("\\\n", " ").split())
    assert command == docs_command, "the README's own-code command is not the docs' command"
    code = next(block for block in _code_blocks(_section(guide, "## Example"), "python")
                if block.startswith("# my_dpsgd.py\n"))
    assert "def train(X, y, seeds, spec)" in signature and "docs' example" in signature
    return command, verdict, code


def _fake_fmnist_files(root: Path) -> None:
    """Fashion-MNIST in its IDX format (tests/fakedata.py): 1,100 training images (classes
    0/1, the brighter class 1; the audit's half subset holds its 500 rows) and 100 test
    images."""
    from fakedata import write_learnable_fmnist

    write_learnable_fmnist(root, n_train=1100)


#: The `dpaudit` command, run by this interpreter (with this checkout's dpaudit).
DPAUDIT = "import sys; from dpaudit.cli import main; sys.exit(main())"


def test_readme_own_code_command_runs_the_docs_example_as_printed(tmp_path):
    """The README's "Audit your own DP-SGD" command, as printed but for its run counts, on
    the docs' example my_dpsgd.py, in a fresh process in the example's folder, offline
    (Fashion-MNIST files in the real format, $DPAUDIT_DATA). The run counts: the fewest the
    claim allows at the command's alpha (40 per side for eps 0.21), 5 validation runs; the
    README's 1000 + 200 take minutes. One thread, as a test worker has (each run is 100
    tiny steps, which two threads on a busy machine slow many times over). The verdict is the first the README explains; the
    second, for the example with sigma / 100, takes more runs (docs: 200 per side)."""
    import os
    import shlex
    import subprocess
    import sys

    from dpaudit.experiments.tramer import min_runs

    command, verdict, code = _own_code_example()
    env_var, program, *argv = shlex.split(command)
    assert (env_var, program, argv[0]) == ("PYTHONPATH=.", "dpaudit", "audit-impl")
    eps, delta = float(argv[argv.index("--eps") + 1]), float(argv[argv.index("--delta") + 1])
    argv[argv.index("--runs") + 1] = str(min_runs(eps, delta))
    argv[argv.index("--val-runs") + 1] = "5"
    (tmp_path / "my_dpsgd.py").write_text(code)
    _fake_fmnist_files(tmp_path / "data")
    src = str(Path(__import__("dpaudit").__file__).parents[1])  # this checkout's dpaudit
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([".", src]),
           "DPAUDIT_DATA": str(tmp_path / "data"), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", DPAUDIT, *argv], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    said = re.findall(r'"([a-z ]+)"', verdict)
    assert said[:2] == ["no violation detected", "violates its claimed guarantee"], verdict
    line = next(x for x in out.stderr.splitlines()
                if x.startswith("audit-impl: my_dpsgd:train: TPR "))
    assert f"(claimed eps {eps:g}); " in line and f": {said[0]};" in line, line
    assert (tmp_path / "results" / "my_audit.csv").is_file()


def _img_sources():
    """docs/img/sources.py, the record of which code draws each image of docs/img."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("img_sources", DOCS / "img" / "sources.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_docs_image_is_as_new_as_the_code_that_draws_it():
    """Each image of docs/img has an entry in docs/img/sources.json (the files of the code
    that draws it, how it was made, that code's digest then), and the code has not changed
    since: after a change, redraw the image as its entry says and record it
    (`python docs/img/sources.py`). The known exceptions say why, and lose their note once
    their code's digest matches again."""
    sources = _img_sources()
    manifest = sources.load()
    images = {path.name for path in (DOCS / "img").glob("*.png")}
    assert images == set(manifest), (f"no entry: {sorted(images - set(manifest))}; "
                                     f"no image: {sorted(set(manifest) - images)}")
    for name, entry in manifest.items():
        assert entry["made_by"] and entry["drawn_by"], name
        assert all((ROOT / path).is_file() for path in entry["drawn_by"]), name
    changed = set(sources.changed(manifest))
    known = {name for name, entry in manifest.items() if entry.get("stale")}
    assert not changed - known, (
        f"images older than the code that draws them: {sorted(changed - known)}; redraw each "
        "as docs/img/sources.json says (made_by), then `python docs/img/sources.py IMAGE`")
    assert known <= changed, f"as new as their code, drop the stale note: {sorted(known - changed)}"
    if known:
        import warnings

        warnings.warn(f"docs images older than their code, not redrawn yet: {sorted(known)}")


def test_image_digest_follows_the_code_not_the_file_times(tmp_path):
    """The digest is of the files' paths and contents: a touched file keeps it, one changed
    byte changes it."""
    import os

    sources = _img_sources()
    files = ["src/dpaudit/plots/hw3.py", "src/dpaudit/plots/style.py"]
    before = sources.digest(files)
    assert before != sources.digest(files[::-1])
    sources.ROOT = tmp_path  # a copy of the two files, made now
    for rel in files:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes((ROOT / rel).read_bytes())
    os.utime(tmp_path / files[0], (0, 0))
    assert sources.digest(files) == before
    (tmp_path / files[1]).write_bytes((ROOT / files[1]).read_bytes() + b"#")
    assert sources.digest(files) != before


def _plots_imported_by(path: str) -> set[str]:
    """The modules of ``dpaudit.plots`` that the plot module at ``path`` imports, directly
    or through another plot module (``from .jagielski import ...``), as repository paths."""
    import ast

    seen, todo = set(), [path]
    while todo:
        tree = ast.parse((ROOT / todo.pop()).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                dep = f"src/dpaudit/plots/{node.module}.py"
                if dep not in seen:
                    seen.add(dep)
                    todo.append(dep)
    return seen


def test_every_docs_image_names_each_plot_module_its_code_imports():
    """An image's `drawn_by` holds every module of `dpaudit.plots` its drawing code imports
    (the one-run figure takes its model names from the Jagielski plot module): a change
    there changes the picture, so the freshness test must see it."""
    manifest = _img_sources().load()
    for name, entry in manifest.items():
        plots = [p for p in entry["drawn_by"] if p.startswith("src/dpaudit/plots/")]
        needed = set().union(*map(_plots_imported_by, plots)) if plots else set()
        assert needed <= set(entry["drawn_by"]), (name, sorted(needed - set(entry["drawn_by"])))


def test_the_import_walk_of_the_image_sources_follows_plot_modules():
    """The walk finds a plot module's plot imports and theirs, and nothing outside plots."""
    assert _plots_imported_by("src/dpaudit/plots/onerun.py") == {
        "src/dpaudit/plots/jagielski.py", "src/dpaudit/plots/style.py"}
    assert _plots_imported_by("src/dpaudit/plots/hw3.py") == {"src/dpaudit/plots/style.py"}
