"""The TUI driven by Textual's pilot, with real generations on the bundled model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from specdiff.compare import compare
from specdiff.lanes import presets
from specdiff.sessions.store import load_session
from specdiff.tui.app import SpecdiffApp, make_app
from specdiff.tui.messages import RunFailed, RunFinished, StepsArrived
from specdiff.tui.widgets import TokenView
from tests.conftest import ForkingPrompt, wait_for

PROMPT = "The history of the Roman Empire"  # for runs that need no fork; where one forks
# depends on the CPU, so the live-run test finds a prompt that forks here


def fork_style_index(app: SpecdiffApp, lane_id: str) -> int | None:
    """The token index drawn with the theme's fork colour in a lane's view."""
    view = app.query_one(f"#lane-{lane_id} TokenView", TokenView)
    palette = app.palette()
    for line in range(len(view.lines)):
        for index, _piece in view.lines[line]:
            style = view.styles_cache.style(
                lane_id, index, app.lanes[lane_id].steps[index], view.marks
            )
            if (
                style.bgcolor is not None
                and style.bgcolor.triplet is not None
                and (style.bgcolor.triplet.hex == palette.fork.lower())
            ):
                return index
    return None


@pytest.mark.model
async def test_live_run_streams_forks_and_navigates(
    tmp_path: Path, forking_prompt: Callable[[str, int], ForkingPrompt]
) -> None:
    messages: list[object] = []
    prompt = forking_prompt("ubatch", 40).prompt

    app = make_app(presets(), "ubatch", prompt, 40, sessions_dir=tmp_path)
    async with app.run_test(size=(120, 40), message_hook=messages.append) as pilot:
        await wait_for(pilot, lambda: app.result is not None)
        await pilot.pause()
        result = app.result
        assert len(app.lanes["a"].steps) == len(app.lanes["b"].steps) == 40
        expected = compare(result.a.steps, result.b.steps).fork
        assert expected is not None and app.fork.index == expected.index
        assert fork_style_index(app, "a") == fork_style_index(app, "b") == expected.index
        panel = app.query_one("#panel").render().renderables
        header = " ".join(str(item) for item in panel[:2])
        assert f"FORK at token {expected.index}" in header
        assert f"margin a {expected.a.margin:.3f}" in header
        assert f"b {expected.b.margin:.3f}" in header
        # navigation: d to the fork, n / p between near ties (staying put when there is
        # none that way: how many there are depends on the CPU), arrows token by token
        await pilot.press("d")
        assert app.cursor == expected.index
        ties = [i for i, s in enumerate(app.lanes["a"].steps) if s.margin < app.near_tie]
        await pilot.press("n")
        next_tie = min((i for i in ties if i > expected.index), default=expected.index)
        assert app.cursor == next_tie
        await pilot.press("p")
        assert app.cursor == max((i for i in ties if i < next_tie), default=next_tie)
        before = app.cursor
        await pilot.press("right")
        assert app.cursor == min(before + 1, 39)  # the last token is as far as it goes
        await pilot.press("l")
        assert app.cursor_lane == "b"
        # save writes a session that loads back with the same steps
        await pilot.press("s")
        await pilot.pause()
        saved = list(tmp_path.glob("*.jsonl"))
        assert len(saved) == 1
        assert load_session(saved[0]).steps["b"] == result.b.steps
    assert any(isinstance(m, StepsArrived) for m in messages)
    assert sum(isinstance(m, RunFinished) for m in messages) == 1


@pytest.mark.model
async def test_stop_cancels_both_lanes() -> None:
    app = make_app(presets(), "spec-vs-plain", PROMPT, 3000)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: len(app.lanes["b"].steps) > 5)
        await pilot.press("x")
        await wait_for(pilot, lambda: app.result is not None, timeout=30)
        result = app.result
        assert result.cancelled
        assert result.a.stop_reason == result.b.stop_reason == "cancelled"
        assert len(result.a.steps) < 3000 and len(result.b.steps) < 3000
        assert not app.running


async def test_bad_inputs_keep_the_app_usable(tmp_path: Path) -> None:
    themes = tmp_path / "themes"
    themes.mkdir()
    (themes / "broken.toml").write_text("name = 'broken'\nprimary = 'not-a-colour'\n")
    (themes / "garbled.toml").write_text("name = [\n")
    messages: list[object] = []

    app = make_app(
        presets(),
        "ubatch",
        "   ",
        20,
        theme_name="no-such-theme",
        theme_dirs=[themes],
    )
    notes: list[str] = []
    notify = app.notify

    def recording_notify(message: str, **options: object) -> None:
        notes.append(message)
        notify(message, **options)

    app.notify = recording_notify
    async with app.run_test(size=(100, 30), message_hook=messages.append) as pilot:
        await pilot.pause()
        assert any("theme broken.toml skipped" in n and "not a colour" in n for n in notes)
        assert any("theme garbled.toml skipped" in n for n in notes)
        assert any("unknown theme 'no-such-theme'" in n for n in notes)
        assert app.theme == "specdiff-dark"
        assert any("the prompt is empty" in n for n in notes)  # autostart refused
        assert not app.running
        # a model that fails to load: the run fails with one message, the app lives on
        app.query_one("#prompt").value = "Hello"
        app.query_one("#lane-a-overrides").value = "model=/nonexistent/model.gguf"
        app.action_run()
        await wait_for(pilot, lambda: any(isinstance(m, RunFailed) for m in messages))
        await pilot.pause()
        assert not app.running
        assert "model file not found" in app.query_one("#status").plain
        app.query_one("#lane-a-overrides").value = "n_ubatch=0"
        app.action_run()
        await pilot.pause()
        assert "'n_ubatch' must be between" in notes[-1] and not app.running
        app.query_one("#lane-a-overrides").value = ""
        app.query_one("#max-tokens").value = "many"
        app.action_run()
        assert "max tokens must be a whole number" in notes[-1] and not app.running


@pytest.mark.parametrize("size", [(80, 24), (200, 50)])
async def test_layout_is_readable_at_small_and_large_sizes(size: tuple[int, int]) -> None:
    session = load_session(Path(__file__).parent / "data" / "ubatch-roman-empire.jsonl")

    app = make_app(presets(), "ubatch", session.prompt, 60, session=session)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        for lane_id in ("a", "b"):
            title = app.query_one(f"#lane-{lane_id} .lane-title")
            assert title.size.width >= 30  # titles not clipped to nothing
            assert title.region.y >= 0
            view = app.query_one(f"#lane-{lane_id} TokenView", TokenView)
            assert view.size.height >= 5  # room for text at 80x24
        assert app.query_one("#panel").size.height >= 6


@pytest.mark.model
async def test_a_lane_error_shows_in_its_pane_and_the_other_lane_finishes(monkeypatch) -> None:
    """Lane b's decode loop fails at step 5 (an injected llama.cpp refusal, in the lanes'
    process); the app reports it once, shows it in b's pane, and lane a runs to the end."""
    monkeypatch.setenv("SPECDIFF_FAULT", "b:5:error")
    notes: list[str] = []

    app = make_app(presets(), "ubatch", PROMPT, 30)
    notify = app.notify
    app.notify = lambda message, **options: (notes.append(message), notify(message, **options))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.result is not None)
        await pilot.pause()
        assert len(app.lanes["a"].steps) == 30 and len(app.lanes["b"].steps) == 5
        assert app.lanes["b"].error and "injected at step 5" in app.lanes["b"].error
        view = app.query_one("#lane-b TokenView", TokenView)
        assert view.trailer is not None and "injected at step 5" in view.trailer
        assert app.query_one("#lane-a TokenView", TokenView).trailer is None
        assert sum("lane b: llama_decode failed" in n for n in notes) == 1


async def test_clicking_a_token_selects_it() -> None:
    session = load_session(Path(__file__).parent / "data" / "ubatch-roman-empire.jsonl")

    app = make_app(presets(), "ubatch", session.prompt, 60, session=session)
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause()
        view = app.query_one("#lane-b TokenView", TokenView)
        index, piece = view.lines[1][1]  # the second token on b's second line
        column = sum(len(p) for _, p in view.lines[1][:1])
        await pilot.click(view, offset=(column + 1, 1))
        assert (app.cursor_lane, app.cursor) == ("b", index)
        panel = " ".join(str(item) for item in app.query_one("#panel").render().renderables)
        assert f"token {index}" in panel or "FORK" in panel
