"""What every report format shares: model text made visible and escaped for Markdown,
HTML and XML, tables in both, the page head and base stylesheet, and JSON-safe numbers.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence

from specdiff.safe_text import pictured

# --- model text -----------------------------------------------------------------------

_SURROGATE = re.compile("[\ud800-\udfff]")


def without_surrogates(text: str) -> str:
    """Lone surrogates (JSON can carry them, no encoder writes them) as U+FFFD."""
    return _SURROGATE.sub("\ufffd", text)


# --- XML and HTML ---------------------------------------------------------------------

# XML 1.0 forbids most C0 controls even as character references; model text can hold them.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]")


def xml_text(text: str) -> str:
    """Text safe inside an element or a double-quoted attribute, in XML and in HTML."""
    cleaned = _NOT_XML.sub("\ufffd", text)
    return (
        cleaned.replace("&", "&amp;")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace('"', "&quot;")
        .replace("'", "&#39;")
    )


def html_table(
    header: Sequence[str],
    rows: Iterable[str],
    escape: Callable[[str], str] = xml_text,
    css_class: str = "",
) -> str:
    """A table of header texts (escaped here) over finished <tr> rows."""
    head = "".join(f"<th>{escape(cell)}</th>" for cell in header)
    opening = f'<table class="{css_class}">' if css_class else "<table>"
    return f"{opening}<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


BASE_STYLE = """
:root{color-scheme:light dark;--bg:#ffffff;--fg:#1f2328;--muted:#59636e;--border:#d1d9e0;
--code:#f6f8fa}
@media (prefers-color-scheme: dark){:root{--bg:#0d1117;--fg:#e6edf3;--muted:#9198a1;
--border:#3d444d;--code:#151b23}}
*{box-sizing:border-box}
body{background:var(--bg);color:var(--fg);
font:15px/1.5 system-ui,-apple-system,"Segoe UI",sans-serif}
h2{border-bottom:1px solid var(--border);padding-bottom:4px}
.muted{color:var(--muted)}
table{border-collapse:collapse}
th,td{border:1px solid var(--border);padding:3px 8px;text-align:left;vertical-align:top}
thead th{background:var(--code)}
figure{margin:0}svg{max-width:100%;height:auto}
"""
"""Light and dark colours, type, headings and tables; each report appends its own rules."""


def page_head(title_html: str, own_style: str) -> str:
    """A self-contained page up to <body>: the title (already escaped) and the base
    stylesheet followed by the report's own rules."""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        '<meta name="color-scheme" content="light dark">\n'
        f"<title>{title_html}</title>\n<style>{BASE_STYLE}{own_style.lstrip()}</style>\n</head>\n"
    )


# --- Markdown -------------------------------------------------------------------------

_MD_INLINE = re.compile(r"([\\`*_\[\]<>|~&])")
_MD_LINE_START = re.compile(r"^(\s*\d*)((?<=\d)[.)]|(?<!\d)[#+\-])")


def md_escape(text: str) -> str:
    """Plain text in Markdown: emphasis, links, HTML, entities and table pipes escaped,
    and a leading character that would start a heading or a list."""
    flat = pictured(text).replace("\n", " ").replace("\t", " ")
    escaped = _MD_INLINE.sub(r"\\\1", flat)
    return _MD_LINE_START.sub(lambda match: f"{match[1]}\\{match[2]}", escaped)


def _longest_backtick_run(text: str) -> int:
    return max((len(run) for run in re.findall("`+", text)), default=0)


def md_code(text: str) -> str:
    """An inline code span that survives backticks and table pipes in the text."""
    text = pictured(text).replace("\n", " ").replace("\t", " ").replace("|", "\\|")
    fence = "`" * (_longest_backtick_run(text) + 1)
    padded = f" {text} " if text.startswith("`") or text.endswith("`") or not text else text
    return f"{fence}{padded}{fence}"


def md_block(text: str) -> str:
    """A fenced block longer than any backtick run inside, so no text can close it."""
    fence = "`" * max(3, _longest_backtick_run(text) + 1)
    return f"{fence}text\n{text}\n{fence}"


def md_table(
    header: Sequence[str], rows: Iterable[Sequence[str]], cell: Callable[[str], str] = str
) -> list[str]:
    """A Markdown table, every cell passed through `cell` (the default keeps cells the
    caller has escaped already)."""
    return list(md_table_lines(header, rows, cell))


def md_table_lines(
    header: Sequence[str], rows: Iterable[Sequence[str]], cell: Callable[[str], str] = str
) -> Iterator[str]:
    """md_table a line at a time, reading `rows` as it goes."""

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cell(text) for text in cells) + " |"

    yield line(header)
    yield "|" + "---|" * len(header)
    for row in rows:
        yield line(row)
