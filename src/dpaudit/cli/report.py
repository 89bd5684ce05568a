"""``dpaudit md-html``: a Markdown result table as a standalone HTML page, for the
Snakemake report (which shows HTML inline but offers Markdown only as a download)."""

from __future__ import annotations

import html
from pathlib import Path

from ..io import write_text
from . import out_file

#: A plain, readable table inside the report's frame.
STYLE = """body { font-family: sans-serif; font-size: 14px; margin: 1em; }
table { border-collapse: collapse; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
thead th { background: #f0f0f0; }"""


def md_page(text: str, title: str) -> str:
    """``text`` (Markdown with pipe tables) as a complete HTML page."""
    import markdown

    body = markdown.markdown(text, extensions=["tables"])
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}"
            f"</title><style>\n{STYLE}\n</style></head>\n<body>\n{body}\n</body></html>\n")


def _md_html(args) -> None:
    from ..io import BODY_SHA256, BadInputFile, read_markdown, read_table

    _, prov = read_table(args.table)
    text = read_markdown(args.md, prov[BODY_SHA256])
    page = md_page(text, args.md.stem)
    if "<table>" not in page:  # an empty page would pass for the report's table
        raise BadInputFile(args.md, "no pipe table in it (expected a Markdown table)")
    write_text(page, args.out)


def register(subparsers) -> None:
    p = subparsers.add_parser("md-html", help="a Markdown table as an HTML page (the report)")
    p.add_argument("--md", type=Path, required=True,
                   help="Markdown table that dpaudit wrote (it ends in a line holding its "
                        "hash and that of the table it renders)")
    p.add_argument("--table", type=Path, required=True,
                   help="the result table (CSV) the Markdown renders")
    p.add_argument("--out", type=out_file, required=True, help="HTML file")
    p.set_defaults(func=_md_html)
