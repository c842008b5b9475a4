"""Text from outside made safe for the places specdiff writes it.

Session files are shared and server lanes talk to machines the user does not control,
so a prompt, a token piece, a pair name, a model id or an error body may hold bytes
aimed at whatever shows them: a terminal (OSC 52 writes the clipboard, OSC 0 sets the
window title, CSI clears the screen; C1 controls and UTF-8-encoded C1 do the same on
some terminals), a Markdown renderer with HTML on (``<script>``, a ``|`` that breaks
the table) or a spreadsheet (a cell ``=HYPERLINK(...)``). Each destination has one
function here, and every other module calls it rather than escaping on its own:

- ``visible(text)``: one line (an error, a name, a header field). Every character
  that is not printable becomes a visible escape (``\\x1b``, ``\\n``, ``\\u202e``), so
  the text stays readable and nothing in it acts on the terminal.
- ``terminal_text(text)``: many lines (a lane's text): newline and tab keep their
  meaning, the rest is escaped as above.
- ``pictured(text)``: model text in a document (a report's code block): newline and
  tab kept, C0 controls and DEL as their Unicode control pictures (one cell wide,
  like the character they stand for: ␛), the rest escaped as above.
- ``markdown_cell(text)`` and ``csv_cell(value)`` for report tables.

Always escaped: C0 controls, DEL, C1 controls, lone surrogates (which cannot even be encoded
to UTF-8, so printing one would crash), the line and paragraph separators, and the
bidirectional overrides, isolates and marks (which make a terminal show text in
another order than it is stored).

One choke point backs them up: ``guarded_output()`` wraps ``sys.stdout`` and
``sys.stderr`` for the length of a command, so a line that forgot to call
``visible`` still reaches the terminal as text. It escapes what ``terminal_text``
escapes. JSON written with ``ensure_ascii=True`` holds no such character and passes
through unchanged; the progress line's carriage return is written to the stream
underneath (``unguarded``). The TUI does not print through these streams (Textual
writes to ``sys.__stderr__``), so its widgets escape what they show themselves.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator
from typing import Any, TextIO

_RAW_IN_JSON = "\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069"
"""The controls json.dumps(ensure_ascii=False) writes as they are: DEL, C1, line
separators and bidirectional marks."""
_CONTROLS = f"\x00-\x08\x0b-\x1f{_RAW_IN_JSON}\ud800-\udfff"
"""What no terminal should receive from outside, newline and tab aside."""
_JSON_UNSAFE = re.compile(f"[{_RAW_IN_JSON}]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_UNSAFE_IN_LINES = re.compile(f"[{_CONTROLS}]")
_ANY_CONTROL = re.compile(f"[\n\t{_CONTROLS}]")
_PICTURES = {code: 0x2400 + code for code in range(0x20) if chr(code) not in "\n\t"}
_PICTURES[0x7F] = 0x2421
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_MARKDOWN_SPECIAL = re.compile(r"[\\`*_\[\]|~]")
_AUTOLINK = re.compile(r"(?<=[A-Za-z]):(?=//)|(?<=www)\.", re.IGNORECASE)
_MARKDOWN_ENTITIES = {ord("&"): "&amp;", ord("<"): "&lt;", ord(">"): "&gt;"}
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
"""What makes a spreadsheet read a CSV cell as a formula (OWASP's list)."""
ELLIPSIS = "…"


def escape(character: str) -> str:
    """A character as the escape a reader recognises: \\n, \\x1b, \\u202e."""
    named = _NAMED.get(character)
    if named is not None:
        return named
    code = ord(character)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _escaped(match: re.Match[str]) -> str:
    return escape(match.group())


def visible(text: str, limit: int | None = None) -> str:
    """`text` on one line: every character that is not printable (controls, separators,
    format characters) shown as its escape; cut to at most `limit` characters, never
    inside an escape, with an ellipsis."""
    pieces = text if text.isprintable() else [c if c.isprintable() else escape(c) for c in text]
    shown = "".join(pieces)
    if limit is None or len(shown) <= limit:
        return shown
    kept, room = [], limit - len(ELLIPSIS)
    for piece in pieces:
        room -= len(piece)
        if room < 0:
            break
        kept.append(piece)
    return "".join(kept) + ELLIPSIS


def terminal_text(text: str, tab: str = "\t") -> str:
    """Text of many lines for a terminal: newlines stay, a tab becomes `tab`, every
    other control character is shown as its escape."""
    shown = _UNSAFE_IN_LINES.sub(_escaped, text)
    return shown if tab == "\t" else shown.replace("\t", tab)


def pictured(text: str) -> str:
    """Model text for a document: newline and tab kept, C0 controls and DEL as their
    control pictures (␛, ␀), every other control character as its escape."""
    return terminal_text(text.translate(_PICTURES))


_LINE_PICTURES = {code: 0x2400 + code for code in range(0x20)}
_LINE_PICTURES[0x0A] = 0x2424  # ␤, the symbol for a newline, reads better than ␊
_LINE_PICTURES[0x7F] = 0x2421
_FROM_LINE_PICTURES = {picture: code for code, picture in _LINE_PICTURES.items()}
_FROM_LINE_PICTURES[0x240A] = 0x0A
_ON_ONE_LINE_ESCAPED = re.compile(f"[{_RAW_IN_JSON}\u2400-\u2426\ud800-\udfff]")
"""What a one-line input shows as an escape: DEL, C1 controls, line separators and
bidi marks (unsafe on a terminal), and the control pictures themselves (which stand
for controls there)."""
_ONE_LINE_ESCAPE = re.compile(
    r"\\x(?:7f|[89][0-9a-f])|\\u(?:061c|200[ef]|202[89a-e]|206[6-9]|24[01][0-9a-f]|242[0-6])"
)
"""The escapes `on_one_line` writes, and only those: any other backslash is the text's."""


def on_one_line(text: str) -> str:
    """Text for a one-line input that edits it: C0 controls as their control pictures
    (a newline as ␤, a tab as ␉); DEL, C1 controls, line separators, bidi marks and
    any control picture already in the text as escapes. `from_one_line` reads either
    back; every other character (a full-width space, a joiner) is shown as it is."""
    return _ON_ONE_LINE_ESCAPED.sub(_escaped, text).translate(_LINE_PICTURES)


def from_one_line(shown: str) -> str:
    """The text a one-line input holds: its control pictures and `on_one_line`'s
    escapes as the characters they stand for; any other backslash as typed (a prompt
    may well hold code)."""
    pictured = shown.translate(_FROM_LINE_PICTURES)
    return _ONE_LINE_ESCAPE.sub(lambda match: chr(int(match.group()[2:], 16)), pictured)


def without_controls(text: str) -> str:
    """`text` with every control character removed, newline and tab included: for text
    already laid out, where an escape would change its width (a control character
    takes no cell)."""
    return _ANY_CONTROL.sub("", text)


def markdown_cell(text: str) -> str:
    """Text for a Markdown table cell: on one line, with Markdown's punctuation escaped
    and <, >, & as entities, so no table break, link, code span or HTML survives; a
    bare URL's `://` and `www.` are escaped too, or GitHub's renderer links them."""
    escaped = _MARKDOWN_SPECIAL.sub(r"\\\g<0>", visible(text))
    escaped = _AUTOLINK.sub(lambda match: "\\" + match.group(), escaped)
    return escaped.translate(_MARKDOWN_ENTITIES)


def first_surrogate(text: str) -> int | None:
    """Where `text` holds a lone surrogate (JSON's "\\udc80", or a byte that is not UTF-8
    in a command line), which no file, session or tokenizer can take; None where none."""
    match = _SURROGATE.search(text)
    return None if match is None else match.start()


def json_text(text: str) -> str:
    """JSON from json.dumps(ensure_ascii=False) with the controls it leaves raw written
    as \\u escapes: only strings hold them, where an escape means the same character."""
    return _JSON_UNSAFE.sub(lambda match: f"\\u{ord(match.group()):04x}", text)


def csv_cell(value: Any) -> Any:
    """A CSV cell: text that a spreadsheet would run as a formula gets a leading
    single quote (OWASP's rule), and control characters other than newline and tab are
    escaped; numbers, numbers written as text (-0.25) and None pass unchanged."""
    if not isinstance(value, str) or _NUMBER.fullmatch(value):
        return value
    text = terminal_text(value)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


class GuardedStream:
    """A text stream that escapes control characters on their way to `unguarded`."""

    def __init__(self, unguarded: TextIO) -> None:
        self.unguarded = unguarded

    def write(self, text: str) -> int:
        self.unguarded.write(terminal_text(text))
        return len(text)

    def writelines(self, lines: Iterator[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        # flush, isatty, fileno, encoding, buffer: those of the stream underneath
        return getattr(self.unguarded, name)


def unguarded(stream: TextIO) -> TextIO:
    """The stream underneath a guard (for specdiff's own control characters: the
    progress line's carriage return), or `stream` itself."""
    return stream.unguarded if isinstance(stream, GuardedStream) else stream


@contextlib.contextmanager
def guarded_output() -> Iterator[None]:
    """sys.stdout and sys.stderr guarded while the block runs, restored after."""
    saved = sys.stdout, sys.stderr
    sys.stdout = GuardedStream(unguarded(sys.stdout))  # type: ignore[assignment]
    sys.stderr = GuardedStream(unguarded(sys.stderr))  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def styled_terminal_text(text: str, sequences: tuple[str, ...]) -> str:
    """`terminal_text` for text that holds specdiff's own colour: each of `sequences`
    (the SGR codes of reports/styles.py) passes as it is, every other control
    character is escaped, so untrusted text inside can at most hold those colours."""
    allowed = "|".join(re.escape(sequence) for sequence in sorted(sequences, key=len, reverse=True))
    pattern = re.compile(f"({allowed})|[{_CONTROLS}]")
    return pattern.sub(lambda match: match.group(1) or escape(match.group()), text)
