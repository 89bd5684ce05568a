"""The configuration's one schema: validation of the whole config and of a section, and
the key reference generated from the schema's descriptions.

``schema.yaml`` (JSON Schema 2020-12, shipped in the package) is the single description of
every key. The Snakefile validates the whole config against it at start-up; each CLI
subcommand validates every JSON argument it takes from the config (``--spec``,
``--train``, ``--data``, ...) against its section, or named keys of sections, with
:func:`validate_section`, so a step run by hand is checked as strictly as one run by
Snakemake (tests/test_cli_wrong_input.py checks that each accepts exactly those keys;
``audit-impl --spec``, the user's own spec passed to the user's function, is no config
section); ``config/README.md`` is :func:`reference_markdown` (a test keeps it current).
The validator refuses NaN and infinities wherever a number is wanted. Only checks that
relate several keys are hand-written: those of a whole config in
:mod:`dpaudit.experiments.checks`, which the workflow runs at start-up, and, with the
same functions where they need no data, in the subcommand that needs them.
"""

from __future__ import annotations

import math
import re
from functools import cache
from pathlib import Path

import yaml

SCHEMA_PATH = Path(__file__).with_name("schema.yaml")


class SpecError(ValueError):
    """A config value is wrong; the message names the key and what is allowed."""


@cache
def schema() -> dict:
    """The config schema (YAML anchors resolved). Read by every command line and Snakemake's
    start-up: with libyaml's parser where PyYAML has it (the same safe loader's result, a
    tenth of the pure-Python parser's time)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(SCHEMA_PATH.read_text(), Loader=loader)


def section_schema(*path: str) -> dict:
    """The schema of the section at ``path`` (e.g. ``"jagielski", "table2"``)."""
    node = schema()
    for i, key in enumerate(path):
        props = node.get("properties") or {}
        if key not in props:
            raise KeyError(f"the config schema has no section {'.'.join(path[:i + 1])!r}")
        node = props[key]
    return node


def subset_schema(keys, *path: str) -> dict:
    """The schema of an object holding only ``keys`` of section ``path`` (all required):
    for a step that is passed the part of a section its output depends on."""
    props = section_schema(*path)["properties"]
    return {"type": "object", "additionalProperties": False, "required": list(keys),
            "properties": {k: props[k] for k in keys}}


def _non_finite(value) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


@cache
def _validator():
    """Draft 2020-12 with NaN and +-inf not numbers: YAML's ``.nan``/``.inf`` and a number
    that overflows a float (``1e999`` in ``--config``) would pass every ``minimum`` (NaN
    compares false) and fail later, far from the key."""
    from jsonschema import Draft202012Validator, validators

    base = Draft202012Validator.TYPE_CHECKER
    finite = base.redefine_many({
        kind: (lambda _, x, kind=kind: base.is_type(x, kind) and not _non_finite(x))
        for kind in ("number", "integer")})
    return validators.extend(Draft202012Validator, type_checker=finite)


def _message(err, where: str) -> str:
    if _non_finite(err.instance):
        return f"{where}={err.instance!r}: must be a finite number; allowed: {_kind(err.schema)}"
    if err.validator == "additionalProperties":
        allowed = sorted(err.schema.get("properties", {}))
        extra = sorted(set(err.instance) - set(allowed))
        return f"{where}.{extra[0]}: unknown key; allowed keys are {allowed}"
    if err.validator == "required":
        key = err.message.split("'")[1]
        what = err.schema.get("properties", {}).get(key, {}).get("description", "")
        return f"{where}.{key} is missing" + (f" ({' '.join(str(what).split())})" if what else "")
    what = " ".join(str(err.schema.get("description", "")).split())
    return f"{where}={err.instance!r}: {err.message}" + (f" ({what})" if what else "")


def validate_section(spec, *path: str, schema_node: dict | None = None):
    """``spec`` if it satisfies the schema of section ``path`` (or ``schema_node``); else
    :class:`SpecError` naming the offending key (``hw3.grids.m.m[1]=-4: ...``, ``hw3.bogus:
    unknown key ...``) and what is allowed."""
    node = section_schema(*path) if schema_node is None else schema_node
    errors = list(_validator()(node).iter_errors(spec))
    if errors:
        err = min(errors, key=lambda e: (len(e.absolute_path), str(list(e.absolute_path))))
        where = ".".join(path) or "config"
        for part in err.absolute_path:
            where += f"[{part}]" if isinstance(part, int) else f".{part}"
        raise SpecError(_message(err, where))
    return spec


# What a text is read as where the schema wants a number, boolean or null: JSON's and YAML
# 1.2's plain spellings only (no YAML 1.1 readings such as 0x10 or 1_000, no yes/no).
_INTEGER = re.compile(r"[+-]?[0-9]+")
_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_BOOLEAN = {"true": True, "True": True, "TRUE": True,
            "false": False, "False": False, "FALSE": False}
_NULL = ("null", "Null", "NULL", "~")
# YAML's and Python's spellings of NaN and infinity: read as such where a number is wanted,
# so that validation refuses them as non-finite numbers rather than as text.
_NON_FINITE = re.compile(r"[+-]?\.?(inf|Inf|INF|infinity|Infinity|nan|NaN|NAN)")


def _types(node: dict) -> list[str]:
    """The JSON types ``node`` accepts by its ``type`` (of it or of its branches)."""
    kinds = node.get("type", [])
    kinds = [kinds] if isinstance(kinds, str) else list(kinds)
    for combinator in ("oneOf", "anyOf"):
        for branch in node.get(combinator, []):
            kinds += _types(branch)
    return kinds


def _readings(text: str, kinds: list[str]):
    for kind in kinds:
        if kind == "null" and text in _NULL:
            yield None
        elif kind == "boolean" and text in _BOOLEAN:
            yield _BOOLEAN[text]
        elif kind in ("integer", "number") and _INTEGER.fullmatch(text):
            yield int(text)
        elif kind == "number" and _NUMBER.fullmatch(text):
            yield float(text)
        elif kind in ("integer", "number") and _NON_FINITE.fullmatch(text):
            yield float(text.replace(".", ""))


def _typed(value, node: dict):
    from jsonschema import Draft202012Validator

    if isinstance(value, dict):
        props, extra = node.get("properties") or {}, node.get("additionalProperties")
        for key, sub in value.items():
            sub_node = props.get(key, extra)
            if isinstance(sub_node, dict):
                value[key] = _typed(sub, sub_node)
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        value[:] = [_typed(v, node["items"]) for v in value]
    elif isinstance(value, str):
        kinds = _types(node)
        if value in _NULL and "null" in kinds:  # null where a string is allowed too
            return None
        if any(Draft202012Validator(node).iter_errors(value)):
            for read in _readings(value, kinds):
                if all(e.validator != "type" for e in Draft202012Validator(node).iter_errors(read)):
                    return read
    return value


def typed_from_text(config: dict, *path: str) -> dict:
    """``config`` (the section at ``path``) with, in place, every string where the schema's
    ``type`` wants a number, boolean or null replaced by its text read as one (a number
    out of range then fails validation as that number): Snakemake reads every value inside
    a nested ``--config`` entry as text (``--config jagielski='{trials: 3}'`` gives
    ``{"trials": "3"}``). ``null`` and ``~`` are null wherever the schema allows null (a
    path that may be null). Any other string the schema accepts is left alone (an eps
    label ``"8"``, a path), and so is one it does not, to fail validation as given (an
    enum of names, ``0x10`` where a number is wanted)."""
    return _typed(config, section_schema(*path) if path else schema())


def results_mismatch(config: dict, tables: dict) -> list[str]:
    """Where the result tables at hand were made with other values than ``config``'s, one
    line per key and value (``jagielski.trials: 40 in results/jagielski_fig2.csv, 1000 in
    this config``, naming the first table). ``tables``: {path: (its config section,
    dotted; {column: key of that section}[; {provenance entry, dotted: (config key, dotted;
    its value)}])}. Of each table that exists: the provenance's seed, every key its
    recorded spec shares with the section, each named provenance entry, and the largest
    value of each named column. A mapping is compared key by key (one line per key that
    differs, missing on one side: None)."""
    import json

    from .io import as_recorded, read_provenance, read_table

    def leaves(key, was, now):
        if isinstance(was, dict) and isinstance(now, dict):
            for k in sorted(set(was) | set(now), key=str):
                yield from leaves(f"{key}.{k}", was.get(k), now.get(k))
        else:
            yield key, as_recorded(was), as_recorded(now)

    found = []
    for path, (dotted, columns, *entries) in tables.items():
        if not Path(path).is_file():
            continue
        section = config
        for key in dotted.split("."):
            section = section[key]
        made = read_provenance(path)
        recorded = {"seed": (made.get("seed"), config["seed"])}
        recorded.update({f"{dotted}.{k}": (v, section[k])
                         for k, v in made.get("spec", {}).items() if k in section})
        for entry, (key, now) in (entries[0] if entries else {}).items():
            was = made
            for part in entry.split("."):
                was = was.get(part) if isinstance(was, dict) else None
            recorded[key] = (was, now)
        if columns:
            rows = read_table(path)[0]
            recorded.update({f"{dotted}.{key}": (rows[col].max().item(), section[key])
                             for col, key in columns.items() if col in rows})
        found += [(key, was, now, path) for name, (was, now) in recorded.items()
                  for key, was, now in leaves(name, was, now) if was != now]
    first = {}  # one line per key and value, naming the first table that holds it
    for key, was, now, path in found:
        first.setdefault((key, json.dumps(was), json.dumps(now)), (was, now, path))
    return [f"{key}: {was!r} in {path}, {now!r} in this config"
            for (key, _, _), (was, now, path) in first.items()]


def _kind(node: dict) -> str:
    if "const" in node:
        return f"`{node['const']}`"
    if "enum" in node:
        return " \\| ".join(f"`{v}`" for v in node["enum"])
    for combinator in ("oneOf", "anyOf"):
        if combinator in node:
            return " or ".join(_kind(b) for b in node[combinator])
    kind = node.get("type", "")
    kind = " or ".join(kind) if isinstance(kind, list) else kind
    limits = [f"{op} {node[key]}" for key, op in (("minimum", ">="), ("exclusiveMinimum", ">"),
                                                    ("maximum", "<="), ("exclusiveMaximum", "<"))
              if key in node]
    if kind == "array" and isinstance(node.get("items"), dict):
        kind = f"list of {_kind(node['items'])}"
    return kind + (f" ({', '.join(limits)})" if limits else "")


def _rows(node: dict, prefix: str = ""):
    for name, sub in (node.get("properties") or {}).items():
        path = f"{prefix}.{name}" if prefix else name
        text = " ".join(str(sub.get("description", "")).split()).replace("|", "\\|")
        yield path, _kind(sub) if "properties" not in sub else "section", text
        yield from _rows(sub, path)
        if isinstance(sub.get("items"), dict):
            yield from _rows(sub["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _rows(node["additionalProperties"], f"{prefix}.<name>")


def reference_markdown() -> str:
    """``config/README.md``: every key of the schema with its type and description."""
    lines = ["# Configuration reference", "",
             "Generated from `src/dpaudit/schema.yaml` by `python -m dpaudit.config`; do not "
             "edit by hand (a test checks that it is current).", "",
             " ".join(str(schema().get("description", "")).split()), "",
             "| key | type | description |", "|---|---|---|"]
    lines += [f"| `{path}` | {kind} | {text} |" for path, kind, text in _rows(schema())]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover
    print(reference_markdown(), end="")
