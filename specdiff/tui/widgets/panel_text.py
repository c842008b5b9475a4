"""What the divergence panel says, laid out for a size: the fork and why, the margins,
the candidates of both lanes, and beside them what the lanes differ in. Plain Rich
renderables, so reports and tests draw the same panel without a screen."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from rich.console import Group, RenderableType
from rich.style import Style
from rich.table import Table
from rich.text import Text

from specdiff.compare import (
    AMBIGUOUS,
    DEFAULT_NEAR_TIE,
    LARGE_MARGIN_SPLIT,
    NEAR_TIE,
    UNSCORED,
    Fork,
    fork_verdict,
)
from specdiff.fork_words import (
    counted,
    fork_explanation,
    held_tie_sentence,
    margins_words,
    quoted_piece,
)
from specdiff.safe_text import visible
from specdiff.steps import TokenStep
from specdiff.tui.themes import readable_on
from specdiff.tui.widgets.styles import Palette


@dataclass(frozen=True)
class PanelView:
    """What the divergence panel shows: the selected step (or the fork) of both lanes."""

    index: int | None
    a: TokenStep | None
    b: TokenStep | None
    fork: Fork | None
    similarity: float | None
    generated: int
    """The tokens each lane has so far (the longer lane's count)."""
    near_tie: float = DEFAULT_NEAR_TIE
    near_ties_before: tuple[tuple[int, float], ...] = ()
    """(index, margin) of lane a's near ties before the fork (or so far, without one)."""
    differences: tuple[str, ...] = ()
    """What the lanes differ in, one "key a / b" each."""


def _candidate_rows(step: TokenStep | None) -> list[tuple[str, str, str]]:
    if step is None:
        return []
    rows = []
    for candidate in step.top:
        probability = step.probability(candidate.logit)
        rows.append(
            (
                quoted_piece(candidate.piece),
                f"{candidate.logit:.3f}",
                "" if probability is None else f"{probability:.3f}",
            )
        )
    return rows


CLASS_BADGES = {
    NEAR_TIE: "near tie",
    AMBIGUOUS: "ambiguous",
    LARGE_MARGIN_SPLIT: "SPLIT",
    UNSCORED: "unscored",
}
"""The fork class badge: a split is not a rounding effect, so it stands out."""


def _class_badge(
    a: TokenStep | None, b: TokenStep | None, near_tie: float, palette: Palette | None
) -> tuple[str, Style]:
    if a is None or b is None:
        return ("", Style())
    kind = fork_verdict(a, b, near_tie=near_tie).kind
    colours = {
        NEAR_TIE: "#5fd787",
        AMBIGUOUS: "#ffd75f",
        LARGE_MARGIN_SPLIT: "#d70000",
        UNSCORED: "#808080",
    }
    if palette is not None:
        colours = {
            NEAR_TIE: palette.insert,
            AMBIGUOUS: palette.tie_bar,
            LARGE_MARGIN_SPLIT: palette.fork,
            UNSCORED: palette.muted,
        }
    background = colours[kind]
    return (
        f" {CLASS_BADGES[kind]} ",
        Style(color=readable_on(background), bgcolor=background, bold=True),
    )


def render_panel(
    index: int | None,
    a: TokenStep | None,
    b: TokenStep | None,
    fork: Fork | None,
    similarity: float | None,
    generated: int,
    near_tie: float = DEFAULT_NEAR_TIE,
) -> Group:
    """The divergence panel at 120x12 cells, as a renderable (for reports and tests)."""
    view = PanelView(index, a, b, fork, similarity, generated, near_tie)
    return panel_renderable(view, 120, 12, None)


WHY_WRAP_HEIGHT = 6
"""From this panel height (an 80x24 screen's) the fork's verdict may take two lines."""
SIMILARITY_LINE_HEIGHT = 7
"""From this panel height (an 80x24 screen's, under a two-row footer) the similarity
after the fork may take a line of its own: the margins line says where each lane
ranked the other's pick, which the candidates' second row would otherwise show."""
SIDE_NOTES_WIDTH = 100
"""From this width the panel puts what the lanes differ in and the near ties before
the fork beside the candidates."""


def panel_renderable(view: PanelView, width: int, height: int, palette: Palette | None) -> Group:
    """The panel laid out for `width` x `height` cells, the most important lines first
    (the fork and why; then the margins; then as many candidates as fit)."""
    lines = panel_lines(view, width, height, palette)
    body = panel_body(view, width, height - len(lines))
    return Group(*lines, *([body] if body is not None else []))


def panel_lines(view: PanelView, width: int, height: int, palette: Palette | None) -> list[Text]:
    """The panel's lines above its candidates: the fork, why, the margins."""
    # a tall panel gives the verdict a second line, and a taller one the similarity
    # after the fork its own; a short one keeps the candidates
    why_width = width if height >= WHY_WRAP_HEIGHT else None
    return _panel_lines(view, palette, why_width, height >= SIMILARITY_LINE_HEIGHT)


def wanted_rows(view: PanelView, width: int) -> int:
    """The rows the panel needs to show everything at `width`: one line without a
    selected step; else its lines, every candidate and, beside them, every near tie."""
    lines = len(panel_lines(view, width, SIMILARITY_LINE_HEIGHT, None))
    if view.index is None:
        return lines
    candidates = 1 + max(len(step.top) if step is not None else 0 for step in (view.a, view.b))
    notes = (1 if view.differences else 0) + 1 + len(view.near_ties_before)
    return lines + max(candidates, notes if width >= SIDE_NOTES_WIDTH else 0)


def panel_body(view: PanelView, width: int, rows: int) -> RenderableType | None:
    """The candidates in `rows` lines, with the side notes beside them where the width
    allows; None without a selected step or room."""
    if view.index is None:
        return None
    table = _candidate_table(view.a, view.b, rows) if rows > 1 else None
    # without probabilities a line under the table says why: the notes leave it room
    note_rows = rows if has_probabilities(view.a, view.b) else rows - 1
    notes = _side_notes(view, max(0, note_rows)) if width >= SIDE_NOTES_WIDTH else None
    if table is not None and notes is not None:
        grid = Table.grid(expand=True, padding=(0, 0, 0, 3))
        grid.add_column(no_wrap=True)
        grid.add_column(ratio=1, overflow="ellipsis")
        grid.add_row(table, notes)
        body: RenderableType = grid
    elif table is None:
        return None
    else:
        body = table
    if has_probabilities(view.a, view.b):
        return body
    # a line of its own under the table: inside it, its length would set the column's
    why = Text(NO_PROBABILITY, style=Style(dim=True, italic=True))
    why.no_wrap, why.overflow = True, "ellipsis"
    return Group(body, why)


def body_key(view: PanelView, width: int, rows: int) -> tuple[object, ...]:
    """What the panel's body is drawn from: the token count and the similarity after the
    fork, which change with every streamed batch, are not in it."""
    return (
        view.index is None,
        view.a,
        view.b,
        view.differences,
        view.fork is not None,
        view.near_ties_before,
        width,
        rows,
    )


def _one_line(*parts: str | tuple[str, str | Style]) -> Text:
    text = Text.assemble(*parts)
    text.no_wrap, text.overflow = True, "ellipsis"
    return text


def _panel_lines(
    view: PanelView, palette: Palette | None, why_width: int | None, similarity_line: bool
) -> list[Text]:
    fork, a, b = view.fork, view.a, view.b
    if view.index is None:
        keys = "d jumps to the fork, " if fork is not None else ""
        return [_one_line((f"no token selected: {keys}n/p near ties, ←/→ token by token", "dim"))]
    # where probabilities are missing the candidates table says why, under itself
    p_note = "".join(  # a drafted step's numbers: "rescored by llama-server /completion"
        f" · {lane} {visible(step.source)}"
        for lane, step in (("a", a), ("b", b))
        if step and step.source
    )
    if fork is not None and view.index == fork.index and a is not None and b is not None:
        return _fork_lines(view, (fork, a, b), palette, p_note, why_width, similarity_line)
    # each lane's own pick at this step: away from the fork the reader still sees
    # what each lane chose before reading the numbers
    picks = " · ".join(
        f"{lane} {quoted_piece(step.piece)}" for lane, step in (("a", a), ("b", b)) if step
    )
    margins = " · ".join(f"{lane} {step.margin:.3f}" for lane, step in (("a", a), ("b", b)) if step)
    lines = [
        _one_line(("token", "bold"), f" {view.index}: {picks}   margins {margins} logits{p_note}")
    ]
    held = _held_tie(view)
    if held is not None:
        lines += [_one_line(line) for line in _two_lines(held, why_width)]
    if fork is not None and view.index > fork.index:
        warning = palette.tie_bar if palette is not None else "yellow"
        lines.append(
            _one_line(
                (
                    f"after the fork (token {fork.index}): the lanes are compared by index, "
                    "though their contexts differ",
                    Style(color=warning, italic=True),
                )
            )
        )
    return lines


def _held_tie(view: PanelView) -> str | None:
    """Why a near tie before the fork (or without one) did not fork the lanes."""
    a, b, fork = view.a, view.b, view.fork
    if a is None or b is None or view.index is None:
        return None
    if fork is not None and view.index >= fork.index:
        return None
    if min(a.margin, b.margin) >= view.near_tie:
        return None
    return held_tie_sentence(a, b)


def _two_lines(text: str, width: int | None) -> list[str]:
    """`text` on one line, or on two where `width` is given and it needs them (the
    second cut to the width by the line it goes in)."""
    if not width or len(text) <= width:
        return [text]
    first = textwrap.wrap(text, width)[0]
    return [first, text[len(first) :].strip()]


def _fork_header(
    view: PanelView, at_fork: tuple[Fork, TokenStep, TokenStep], palette: Palette | None
) -> Text:
    """FORK, where, its class badge and the two tokens."""
    fork, a, b = at_fork
    return _one_line(
        ("FORK", "bold reverse"),
        # the fork's index beside the tokens shown, never "N of M": an index next to
        # a count reads as off by one
        f" at token {fork.index} · {counted(view.generated, 'token')} shown ",
        _class_badge(a, b, view.near_tie, palette),
        " ",
        ("a ", "bold"),
        quoted_piece(fork.piece_a),
        " vs ",
        ("b ", "bold"),
        quoted_piece(fork.piece_b),
    )


def _fork_lines(
    view: PanelView,
    at_fork: tuple[Fork, TokenStep, TokenStep],
    palette: Palette | None,
    p_note: str,
    why_width: int | None,
    similarity_line: bool = False,
) -> list[Text]:
    """The fork's header, its verdict (on two lines when `why_width` is given and it
    needs them) and its margins (the similarity after the fork on a line of its own with
    `similarity_line`, where they do not fit one)."""
    fork, a, b = at_fork
    verdict = fork_verdict(a, b, near_tie=view.near_tie)
    similar = (
        f" · after the fork {view.similarity:.0%} similar" if view.similarity is not None else ""
    )
    margins = margins_words(fork)
    margin_lines = [f"{margins}{similar}{p_note}"]
    if similarity_line and why_width and len(margin_lines[0]) > why_width and similar:
        # a tall panel gives the similarity its own line rather than cut it
        margin_lines = [f"{margins}{p_note}", similar.removeprefix(" · ")]
    # probabilities first: a newcomer reads "39% vs 37%" where "0.06 apart" says
    # nothing; the logits are on the margins line below, the class in the header's badge
    why = f"why: {fork_explanation(fork, verdict, ('lane a', 'lane b')).plain}"
    why_lines = _two_lines(why, why_width)
    return [
        _fork_header(view, at_fork, palette),
        *(
            _one_line(("why:", "bold") if not n else "", line[4:] if not n else line)
            for n, line in enumerate(why_lines)
        ),
        *(_one_line(line) for line in margin_lines),
    ]


def has_probabilities(a: TokenStep | None, b: TokenStep | None) -> bool:
    """Whether both steps kept their normalizer, which a probability needs."""
    return all(step is None or step.logsumexp is not None for step in (a, b))


NO_PROBABILITY = "no p (probability) here: only the fork step keeps what p needs"
"""Under the candidates of a step without its normalizer: why the p column is missing."""


def _candidate_table(a: TokenStep | None, b: TokenStep | None, rows: int) -> Table:
    """Both lanes' candidates in `rows` lines (the header included); the p columns only
    where both steps kept what a probability needs (else `panel_body` says why under
    the table, in a line of its own, which `rows` leaves room for)."""
    with_p = has_probabilities(a, b)
    table = Table(box=None, pad_edge=False, expand=False, show_edge=False)
    lane_headers = ("token", "logit", "p") if with_p else ("token", "logit")
    for header in (*lane_headers, "", *lane_headers):
        table.add_column(header, no_wrap=True, overflow="ellipsis", max_width=18)
    for lane_id, column in (("a", 0), ("b", len(lane_headers) + 1)):
        table.columns[column].header = f"{lane_id} token"
    width = len(lane_headers)
    rows_a = [row[:width] for row in _candidate_rows(a)]
    rows_b = [row[:width] for row in _candidate_rows(b)]
    shown = rows - 1 if with_p else rows - 2  # the header; the caption where there is one
    for row in range(min(shown, max(len(rows_a), len(rows_b)))):
        left = rows_a[row] if row < len(rows_a) else ("",) * width
        right = rows_b[row] if row < len(rows_b) else ("",) * width
        table.add_row(*left, "│", *right)
    return table


def _side_notes(view: PanelView, rows: int) -> Text:
    """What the lanes differ in, then lane a's near ties before the fork."""
    lines: list[Text] = []
    if view.differences:
        lines.append(_one_line(("lanes differ in ", "bold"), " · ".join(view.differences)))
    where = "before the fork" if view.fork is not None else "so far"
    ties = view.near_ties_before
    lines.append(_one_line((f"near ties {where} (a): ", "bold"), str(len(ties))))
    for index, margin in ties[: max(0, rows - len(lines))]:
        lines.append(_one_line(f"  token {index}  margin {margin:.3f}"))
    return Text("\n").join(lines)
