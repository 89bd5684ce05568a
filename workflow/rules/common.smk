# Shared helpers for the rule files.  Rules call the `dpaudit` CLI with their config
# section as JSON (`--spec`) and write into results/ and figures/.
import json
import shlex

# Every rule file appends the figures (PDF; a PNG is written beside each) it renders.
FIGURES = []
ENV = "../../environment.yml"


def quoted_json(value):
    """`value` as a shell-quoted JSON string."""
    return shlex.quote(json.dumps(value, sort_keys=True))


def spec(*keys, **extra):
    """The config section at `keys` (plus `extra`) as a shell-quoted JSON string."""
    section = config
    for key in keys:
        section = section[key]
    return quoted_json({**section, **extra})
