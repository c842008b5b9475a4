"""Text from outside that ends up in a one-line message never carries control codes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from specdiff.errors import printable


def test_escape_sequences_become_visible_placeholders() -> None:
    hostile = "GGML_ASSERT(x) failed \x1b]52;c;ZXZpbA==\x07\x1b[2J\r\nend"
    shown = printable(hostile)
    assert "\x1b" not in shown and "\x07" not in shown and "\n" not in shown
    assert shown.startswith("GGML_ASSERT(x) failed \\x1b]52;c;")


@given(st.text(max_size=500))
def test_any_text_comes_out_printable_and_bounded(text: str) -> None:
    shown = printable(text)
    assert shown.isprintable() or shown == ""
    assert len(shown) <= 200
