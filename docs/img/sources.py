"""Which code draws each image of docs/img, and that code's digest when the image was made.

``tests/test_docs.py`` fails when an image's code has changed since (the picture may no longer
be what the code draws) or when an image has no entry. Digests are of file contents, not
modification times, so a git checkout leaves them as they are.

After redrawing an image (its ``made_by`` says how), record it::

    python docs/img/sources.py IMAGE.png [IMAGE.png ...]

or, for a figure, downscale its PNG into docs/img (``WIDTH`` px wide, ``COLOURS`` colours,
256 if not given: fewer keep a busy figure under the docs' 150 KiB) and record it in one go::

    python docs/img/sources.py --from figures/NAME.png IMAGE.png WIDTH [COLOURS]

``python docs/img/sources.py`` alone lists the images whose code has changed since.
An entry with ``stale`` is an image known to predate its code that cannot be redrawn here
(the reason says why); the test names it, and fails once its digest matches again so that
the note goes.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = Path(__file__).with_name("sources.json")


def digest(paths: list[str]) -> str:
    """sha256 over each file's repository path and contents, in the order given."""
    h = hashlib.sha256()
    for rel in paths:
        h.update(rel.encode() + b"\0" + (ROOT / rel).read_bytes() + b"\0")
    return h.hexdigest()


def load() -> dict:
    return json.loads(MANIFEST.read_text())


def changed(manifest: dict) -> list[str]:
    """The images whose code's digest differs from the recorded one."""
    return [name for name, entry in manifest.items() if digest(entry["drawn_by"]) != entry["sha256"]]


def record(names: list[str]) -> None:
    manifest = load()
    for name in names:
        name = Path(name).name
        if name not in manifest:
            sys.exit(f"{name}: no entry in {MANIFEST.name}; add one (drawn_by, made_by)")
        manifest[name]["sha256"] = digest(manifest[name]["drawn_by"])
        manifest[name].pop("stale", None)
    MANIFEST.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def downscale(figure: str, image: str, width: int, colours: int = 256) -> None:
    """``figure`` (a PNG) at ``width`` px, in ``colours`` colours, as docs/img/``image``."""
    from PIL import Image

    im = Image.open(figure).convert("RGB")
    im = im.resize((width, round(im.height * width / im.width)), Image.LANCZOS)
    im.quantize(colours).save(MANIFEST.with_name(Path(image).name), optimize=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--from"]:
        figure, image, width, *colours = sys.argv[2:6]
        downscale(figure, image, int(width), *map(int, colours))
        record([image])
    elif sys.argv[1:]:
        record(sys.argv[1:])
    else:
        print("\n".join(changed(load())) or "every image is as new as its code")
