"""README.md documents every config key of the schema and the CI's test command."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SCHEMA = ROOT / "config" / "schema.yaml"
CI = ROOT / ".ci" / "run"
CI_MARKER = "# --- the README's test command, verbatim ---"

#: Top-level config sections whose README docs may still be a placeholder line. While
#: the README holds that line, the keys of the section are not required; once the line is
#: filled in, they are.
PENDING = {"jagielski": "JAGIELSKI_CONFIG_PLACEHOLDER", "data": "DATA_CONFIG_PLACEHOLDER"}


def _readme_lines() -> list[str]:
    return [line.strip() for line in README.read_text().splitlines()]


def schema_keys(node: dict, prefix: str = "") -> list[str]:
    """Dotted paths of every key under ``node``'s ``properties``, recursively.

    Anchors and aliases are already resolved by ``yaml.safe_load``. The walk also follows
    ``items`` (arrays of objects) and the branches of ``allOf``/``anyOf``/``oneOf``. Both
    kinds keep the path.
    """
    keys: list[str] = []
    if not isinstance(node, dict):
        return keys
    for name, sub in (node.get("properties") or {}).items():
        path = f"{prefix}.{name}" if prefix else name
        keys.append(path)
        keys.extend(schema_keys(sub, path))
    if isinstance(node.get("items"), dict):
        keys.extend(schema_keys(node["items"], prefix))
    for combinator in ("allOf", "anyOf", "oneOf"):
        for branch in node.get(combinator) or []:
            keys.extend(schema_keys(branch, prefix))
    return list(dict.fromkeys(keys))


def test_schema_walk_sees_nested_and_aliased_keys():
    keys = schema_keys(yaml.safe_load(SCHEMA.read_text()))
    for key in ("seed", "hw3.grids.eps.m", "hw3.grids.d.d", "accounting.composition.num_k",
                "tramer.model.lr", "tramer.user.spec", "tramer.user.val_runs"):
        assert key in keys, key


def test_readme_documents_every_schema_key():
    text = README.read_text()
    lines = _readme_lines()
    pending = {section for section, line in PENDING.items() if line in lines}
    keys = schema_keys(yaml.safe_load(SCHEMA.read_text()))
    assert keys, "no keys found in config/schema.yaml"
    missing = [key for key in keys
               if key.split(".")[0] not in pending and f"`{key}`" not in text]
    assert not missing, (f"config keys not documented in README.md as `inline code`: {missing} "
                         "(add them to the Configuration section)")


def test_readme_has_no_unfilled_placeholders_or_dangling_data_anchor():
    lines = _readme_lines()
    leftover = [line for line in lines
                if re.fullmatch(r"[A-Z_]*PLACEHOLDER", line) and line not in PENDING.values()]
    assert not leftover, leftover
    if "](#data)" in README.read_text():
        assert "## Data" in lines


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
