"""The compare screen as a newcomer first meets it, at 80x24 and at 200x50: hints whole
and gone once stale, every key in the footer after a fork, the note of another CPU in
the status line (not over the controls or lane b's title), the fork's margins with
their unit, and why a near tie that did not fork held."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdiff.tui.app import SpecdiffApp
from specdiff.tui.messages import MachineCompared
from specdiff.tui.widgets.panel import Panel
from tests.conftest import wait_for
from tests.tui_driver import drive, rendered_lines, session_app

SESSION = Path(__file__).parent / "data" / "ubatch-roman-empire.jsonl"
SIZES = [(80, 24), (200, 50)]
HELD_TIE = 2
"""A near tie of the committed session before its fork (margin 0.053) that held."""

pytestmark = pytest.mark.tui


def panel_text(app: SpecdiffApp) -> str:
    return "\n".join(str(line) for line in app.query_one(Panel).render().renderables)


async def at_the_fork(app: SpecdiffApp, pilot) -> None:
    await wait_for(pilot, lambda: drive(app).fork is not None and drive(app).played_out, 30)
    await pilot.press("d")
    await pilot.pause()


@pytest.mark.parametrize("size", SIZES)
async def test_the_fork_margins_say_logits_and_ranks(size) -> None:
    app = session_app(SESSION)
    async with app.run_test(size=size) as pilot:
        await at_the_fork(app, pilot)
        fork = drive(app).fork
        line = f"margins a {fork.a.margin:.3f} · b {fork.b.margin:.3f} logits"
        shown = "\n".join(rendered_lines(app))
        assert line in shown
        assert "each lane ranked the other's pick 2nd" in shown
        assert "b's pick in a #" not in shown


@pytest.mark.parametrize("size", SIZES)
async def test_a_hint_is_whole_and_goes_when_the_cursor_moves(size) -> None:
    app = session_app(SESSION)
    async with app.run_test(size=size) as pilot:
        await at_the_fork(app, pilot)
        status_row = rendered_lines(app)[app.query_one("#status").region.y]
        assert "d jumps to the fork · e writes a report" in status_row  # whole
        await pilot.press("n")  # no near tie after the fork: the note says why
        await pilot.pause()
        status_row = rendered_lines(app)[app.query_one("#status").region.y]
        assert "near ties end there" in status_row
        await pilot.press("left")
        await pilot.pause()
        assert "near ties end there" not in drive(app).status
        # the note under a step without probabilities is whole too
        status_before = drive(app).status
        assert "no p (probability) here: only the fork step keeps what p needs" in "\n".join(
            rendered_lines(app)
        )
        assert drive(app).status == status_before


@pytest.mark.parametrize("size", SIZES)
async def test_the_footer_keeps_every_key_after_the_fork(size) -> None:
    app = session_app(SESSION)
    async with app.run_test(size=size) as pilot:
        await at_the_fork(app, pilot)
        await pilot.pause(0.2)
        keys = {key.key: key for key in app.query("FooterKey")}
        for key in ("question_mark", "q", "d", "w", "n", "p", "l", "a", "e", "s"):
            assert key in keys, key
            region = keys[key].region
            assert region.width > 0 and region.right <= size[0], key
        bottom = rendered_lines(app)[-1]
        assert "? help" in bottom and "q quit" in bottom


@pytest.mark.parametrize("size", SIZES)
async def test_another_cpu_is_said_in_the_status_line_not_over_the_controls(size) -> None:
    from textual.widgets._toast import Toast

    app = session_app(SESSION)
    async with app.run_test(size=size, notifications=True) as pilot:
        await at_the_fork(app, pilot)
        line = "recorded on another CPU (Other CPU -> This CPU): kernels round otherwise"
        screen = drive(app).screen
        screen.host.post(screen.replay.receive, MachineCompared(drive(app).session, line))
        await pilot.pause(0.3)
        assert not list(app.screen.query(Toast))
        status_row = rendered_lines(app)[app.query_one("#status").region.y]
        assert "another CPU" in status_row
        said = drive(app).status
        assert said.startswith("recorded on another CPU: a run here may fork elsewhere")
        assert screen.status_line.said.split(" · ")[1] == "another CPU"  # beside the file
        title = app.query_one("#lane-b .lane-title")
        assert title.plain.startswith("B · ")
        await pilot.press("right")  # the sentence goes; the mark beside the file stays
        await pilot.pause()
        assert "another CPU" in rendered_lines(app)[app.query_one("#status").region.y]


@pytest.mark.parametrize("size", SIZES)
async def test_a_near_tie_that_held_says_why(size) -> None:
    app = session_app(SESSION)
    async with app.run_test(size=size) as pilot:
        await at_the_fork(app, pilot)
        session = drive(app).session
        a, b = session.steps["a"][HELD_TIE], session.steps["b"][HELD_TIE]
        assert a.token_id == b.token_id and a.margin < drive(app).near_tie
        for _ in range(drive(app).fork.index - HELD_TIE):
            await pilot.press("left")
        await pilot.pause()
        assert drive(app).cursor == HELD_TIE
        text = " ".join(panel_text(app).split())
        assert "why it held:" in text
        assert f"by {a.margin:.3f} logits in lane a" in text
        assert "less than the lead itself" in text
        shown = " ".join(" ".join(rendered_lines(app)).split())
        assert "less than the lead itself" in shown  # on screen, not cut
