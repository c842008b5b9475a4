"""The TUI driven by Textual's pilot, with real generations on the bundled model."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from specdiff.compare import compare
from specdiff.lanes import presets
from specdiff.sessions.store import load_session
from specdiff.tui.app import SpecdiffApp, make_app
from specdiff.tui.messages import RunFailed, RunFinished, StepsArrived
from specdiff.tui.widgets import TokenView
from tests.conftest import ForkingPrompt, wait_for
from tests.tui_driver import drive, reports

PROMPT = "The history of the Roman Empire"  # for runs that need no fork; where one forks
# depends on the CPU, so the live-run test finds a prompt that forks here


def fork_style_index(app: SpecdiffApp, lane_id: str) -> int | None:
    """The token index drawn with the theme's fork colour in a lane's view."""
    view = app.query_one(f"#lane-{lane_id} TokenView", TokenView)
    palette = drive(app).palette()
    for line in range(len(view.lines)):
        for index, _piece in view.lines[line]:
            style = view.styles_cache.style(
                lane_id, index, drive(app).lanes[lane_id].steps[index], view.marks
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
        await wait_for(pilot, lambda: drive(app).result is not None)
        await pilot.pause()
        result = drive(app).result
        assert len(drive(app).lanes["a"].steps) == len(drive(app).lanes["b"].steps) == 40
        expected = compare(result.a.steps, result.b.steps).fork
        assert expected is not None and drive(app).fork.index == expected.index
        assert fork_style_index(app, "a") == fork_style_index(app, "b") == expected.index
        # found while streaming, the fork was scrolled into view in both panes and kept there
        await wait_for(pilot, lambda: fork_in_view(app), 20)
        assert "d jumps to the fork" in app.query_one("#status").plain
        panel = app.query_one("#panel").render().renderables
        header = " ".join(str(item) for item in panel[:4])  # the fork, why, the margins
        assert f"FORK at token {expected.index}" in header
        assert f"margins a {expected.a.margin:.3f}" in header
        assert f"b {expected.b.margin:.3f}" in header
        assert drive(app).cursor == expected.index  # the view went to the fork: the cursor too
        # navigation: d to the fork, n / p between near ties (staying put when there is
        # none that way: how many there are depends on the CPU), arrows token by token
        await pilot.press("d")
        assert drive(app).cursor == expected.index
        ties = [
            i
            for i, s in enumerate(drive(app).lanes["a"].steps[: expected.index])
            if s.margin < drive(app).near_tie
        ]
        await pilot.press("n")
        next_tie = min((i for i in ties if i > expected.index), default=expected.index)
        assert drive(app).cursor == next_tie
        await pilot.press("p")
        assert drive(app).cursor == max((i for i in ties if i < next_tie), default=next_tie)
        before = drive(app).cursor
        await pilot.press("right")
        assert drive(app).cursor == min(before + 1, 39)  # the last token is as far as it goes
        await pilot.press("l")
        assert drive(app).cursor_lane == "b"
        # save writes a session that loads back with the same steps
        await pilot.press("s")
        await pilot.pause()
        saved = list(tmp_path.glob("*.jsonl"))
        assert len(saved) == 1
        assert load_session(saved[0]).steps["b"] == result.b.steps
    assert any(isinstance(m, StepsArrived) for m in reports(messages))
    assert sum(isinstance(m, RunFinished) for m in reports(messages)) == 1


@pytest.mark.model
async def test_stop_cancels_both_lanes() -> None:
    app = make_app(presets(), "spec-vs-plain", PROMPT, 3000)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: len(drive(app).lanes["b"].steps) > 5)
        await pilot.press("x")
        await wait_for(pilot, lambda: drive(app).result is not None, timeout=30)
        result = drive(app).result
        assert result.cancelled
        assert result.a.stop_reason == result.b.stop_reason == "cancelled"
        assert len(result.a.steps) < 3000 and len(result.b.steps) < 3000
        assert not drive(app).running


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
        assert not drive(app).running
        # a model that fails to load: the run fails with one message, the app lives on
        app.query_one("#prompt").value = "Hello"
        app.query_one("#lane-a-overrides").value = "model=/nonexistent/model.gguf"
        drive(app).run()
        await wait_for(pilot, lambda: any(isinstance(m, RunFailed) for m in reports(messages)))
        await pilot.pause()
        assert not drive(app).running
        assert "model file not found" in app.query_one("#status").plain
        # the failure is lane a's: its pane says so, lane b's does not
        assert "model file not found" in (drive(app).lanes["a"].error or "")
        assert drive(app).lanes["b"].error is None
        # lane b, which never ran, says why it has nothing (and no rate for no tokens)
        assert drive(app).stats_line("b").startswith("stopped: lane a failed · 0 tokens")
        assert "tok/s" not in drive(app).stats_line("b")
        app.query_one("#lane-a-overrides").value = "n_ubatch=0"
        drive(app).run()
        await pilot.pause()
        assert "'n_ubatch' must be between" in notes[-1] and not drive(app).running
        app.query_one("#lane-a-overrides").value = ""
        app.query_one("#max-tokens").value = "many"
        drive(app).run()
        assert "max tokens must be a whole number" in notes[-1] and not drive(app).running


@pytest.mark.parametrize("size", [(80, 24), (200, 50)])
async def test_layout_is_readable_at_small_and_large_sizes(size: tuple[int, int]) -> None:
    session = load_session(Path(__file__).parent / "data" / "ubatch-roman-empire.jsonl")

    app = make_app(presets(), "ubatch", session.prompt, 60, session=session)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        lanes = app.query_one("#lanes").region
        for lane_id in ("a", "b"):
            title = app.query_one(f"#lane-{lane_id} .lane-title")
            assert title.size.width >= 30  # titles not clipped to nothing
            # on screen, inside the lanes' frame: under the controls, above the panel
            assert lanes.y < title.region.y < lanes.bottom and title.region.height == 1
            view = app.query_one(f"#lane-{lane_id} TokenView", TokenView)
            assert view.size.height >= 5  # room for text at 80x24
        assert app.query_one("#panel").size.height >= 6


@pytest.mark.parametrize("size", [(80, 24), (200, 50)])
async def test_the_aligned_view_and_back_keeps_each_pane_at_its_width(size) -> None:
    """`a` then escape: each pane's text is laid out again at the pane's own width (not
    a width guessed while the panes were hidden), and its stats line fits the pane."""
    from rich.cells import cell_len

    app = session_app()
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        widths = {}
        for lane_id in ("a", "b"):
            widths[lane_id] = app.query_one(f"#lane-{lane_id} TokenView", TokenView).width_used
        await pilot.press("a")
        await pilot.pause()
        assert app.query_one("#aligned").display and not app.query_one("#lanes").display
        await pilot.press("escape")
        await pilot.pause()
        await pilot.pause()
        for lane_id in ("a", "b"):
            view = app.query_one(f"#lane-{lane_id} TokenView", TokenView)
            width = view.scrollable_content_region.width
            assert view.width_used == width == widths[lane_id]
            assert max(view.line_widths) <= width  # no line wider than the pane: no cut
            stats = app.query_one(f"#lane-{lane_id} .lane-stats").plain
            pane = app.query_one(f"#lane-{lane_id}")
            assert "…" not in stats and cell_len(stats) <= pane.content_size.width - 2


async def test_the_panel_takes_only_the_rows_it_needs_and_plus_minus_change_its_share() -> None:
    """Before a token is selected the panel is one line (the panes take the rest); at the
    fork it shows its lines whole, up to its share of the screen, which + and - step."""
    idle = idle_app()
    async with idle.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert idle.query_one("#panel").size.height == 1
        assert idle.query_one("#lane-a TokenView").size.height >= 12
    app = session_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        panel = app.query_one("#panel")
        assert drive(app).fork is not None and drive(app).cursor == drive(app).fork.index
        shown = [str(line) for line in panel.render().renderables[:5]]
        assert any(line.startswith("after the fork ") for line in shown)  # not cut to "af…"
        assert not any(line.endswith("…") for line in shown[1:3])  # the why, whole
        at_start = panel.size.height
        assert at_start <= 0.4 * 24
        await pilot.press("plus", "plus")
        await pilot.pause()
        assert panel.size.height > at_start  # room for more of the candidates
        assert "up to 60% of the screen" in app.query_one("#status").plain
        await pilot.press("minus", "minus", "minus", "minus")
        await pilot.pause()
        assert panel.size.height < at_start
        assert app.query_one("#lane-a TokenView").size.height > 5


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
        await wait_for(pilot, lambda: drive(app).result is not None)
        await pilot.pause()
        assert len(drive(app).lanes["a"].steps) == 30 and len(drive(app).lanes["b"].steps) == 5
        assert drive(app).lanes["b"].error and "injected at step 5" in drive(app).lanes["b"].error
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
        # a token on b's second line that is not the fork (whose panel says FORK)
        assert drive(app).fork is not None
        fork = drive(app).fork.index
        place = next(n for n, (index, _) in enumerate(view.lines[1]) if index != fork)
        index = view.lines[1][place][0]
        column = sum(len(piece) for _, piece in view.lines[1][:place])
        await pilot.click(view, offset=(column + 1, 1))
        assert (drive(app).cursor_lane, drive(app).cursor) == ("b", index)
        panel = " ".join(str(item) for item in app.query_one("#panel").render().renderables)
        assert f"token {index}: " in panel


# -- focus, layout and presenter mode (no model: recorded sessions, refused runs) ----------

DEMO_SESSIONS = sorted((Path(__file__).parent.parent / "sessions").glob("*.jsonl"))
SESSION = Path(__file__).parent / "data" / "ubatch-roman-empire.jsonl"
SIZES = [(80, 24), (120, 40)]
INPUTS = ["#prompt", "#max-tokens", "#lane-a-overrides", "#lane-b-overrides"]


def idle_app(prompt: str = "") -> SpecdiffApp:
    """The app with no run started; an empty prompt makes any run it is asked for stop
    at once with a note, so no model is loaded."""
    return make_app(presets(), "ubatch", prompt, 20, autostart=False)


def session_app(path: Path = SESSION, speed: float | None = None, **options) -> SpecdiffApp:
    session = load_session(path)
    return make_app(
        presets() | {session.pair.name: session.pair},
        session.pair.name,
        session.prompt,
        session.header.max_tokens,
        session=session,
        replay_speed=speed,
        **options,
    )


async def open_input(app: SpecdiffApp, pilot, selector: str) -> None:
    """Put the cursor in an input as a user would: `c` first where the rows are folded."""
    if app.screen.has_class("narrow"):
        await pilot.press("c")
    app.query_one(selector).focus()
    await pilot.pause()


def footer_keys(app: SpecdiffApp) -> dict[str, Any]:
    # by the widget's type name: Textual's footer keys are not public API
    return {key.key: key for key in app.query("FooterKey")}


async def settled_footer(app: SpecdiffApp, pilot) -> dict[str, Any]:
    """The footer's keys once it is laid out: it is composed again whenever the keys
    that apply change (a replay opened, the screen resized)."""

    def laid_out() -> bool:
        keys = footer_keys(app)
        return "ctrl+p" in keys and all(key.region.width for key in keys.values())

    await wait_for(pilot, laid_out, 10)
    return footer_keys(app)


@pytest.mark.parametrize("size", SIZES)
async def test_escape_leaves_every_input_for_the_panes(size) -> None:
    app = idle_app("Hello")
    async with app.run_test(size=size) as pilot:
        for selector in [*INPUTS, "#pair"]:
            await open_input(app, pilot, selector)
            assert app.focused is app.query_one(selector)
            await pilot.press("escape")
            assert app.focused is app.query_one("#lanes"), selector
            assert not app.screen.has_class("configuring")
            assert not drive(app).running  # escape leaves an input; it never starts or stops a run
        await open_input(app, pilot, "#pair")  # a chosen pair hands the keys back too
        await pilot.press("enter", "down", "enter")
        await pilot.pause()
        assert app.query_one("#pair").value != "ubatch"
        assert app.focused is app.query_one("#lanes")


async def test_a_key_typed_after_enter_never_lands_in_an_input() -> None:
    app = idle_app()
    async with app.run_test(size=(80, 24)) as pilot:
        for selector in INPUTS:
            await open_input(app, pilot, selector)
            before = {name: app.query_one(name).value for name in INPUTS}
            await pilot.press("enter")  # refused: the prompt is empty; no model is loaded
            assert app.focused is app.query_one("#lanes"), selector
            for key in ("d", "n", "x", "p", "l"):
                await pilot.press(key)
            assert {name: app.query_one(name).value for name in INPUTS} == before
        await pilot.press("q")
        await pilot.pause()
    assert app.return_code == 0  # q quit instead of being typed


@pytest.mark.parametrize("size", SIZES)
async def test_the_footer_keeps_help_and_quit(size) -> None:
    app = make_app(presets(), "ubatch", "Hello", 20, autostart=False)
    async with app.run_test(size=size) as pilot:
        for _round in range(2):  # and again after leaving the input
            for where in ("panes", "input"):
                if where == "input":
                    await open_input(app, pilot, "#prompt")
                keys = await settled_footer(app, pilot)
                shown = ("question_mark", "q") if where == "panes" else ("f1", "ctrl+q")
                palette = keys["ctrl+p"].region
                for key in shown:
                    region = keys[key].region
                    assert region.width > 0 and region.right <= palette.x, (where, key)
            await pilot.press("f1")  # f1 and ctrl+q act from inside an input
            assert type(app.screen).__name__ == "HelpScreen"
            await pilot.press("escape", "escape")
            assert app.focused is app.query_one("#lanes")


def test_help_names_every_key_the_footer_shows() -> None:
    from specdiff.tui.help import HELP_ROWS

    documented = " ".join(key for key, _ in HELP_ROWS)
    names = {"question_mark": "?", "left": "←", "right": "→"}
    for binding in SpecdiffApp.BINDINGS:
        assert names.get(binding.key, binding.key) in documented, binding.key


async def test_narrow_screens_fold_the_inputs_into_a_config_bar() -> None:
    app = make_app(presets(), "server-cache-vs-fresh", "The history of Rome", 33, autostart=False)
    async with app.run_test(size=(120, 24)) as pilot:
        bar, controls = app.query_one("#config-bar"), app.query_one("#controls")
        for width, folded in ((100, False), (99, True), (79, True)):
            await pilot.resize_terminal(width, 24)
            await pilot.pause()
            assert bar.display == folded and controls.display != folded, width
        assert "server-cache-vs-fresh" in bar.plain and "max 33" in bar.plain
        await pilot.press("c")
        assert controls.display and app.query_one("#overrides").display and not bar.display
        assert app.focused is app.query_one("#prompt")
        label = app.query_one("#max-label")
        assert str(label.render()) == "max" and label.region.width > 0
        assert app.query_one("#prompt").region.width >= 12  # room for what is typed
        await pilot.press("end", "!", "escape")
        assert bar.display and not controls.display
        assert "The history of Rome!" in bar.plain
        await pilot.resize_terminal(120, 24)
        await pilot.pause()
        assert str(label.render()) == "max tokens"


@pytest.mark.parametrize("size", SIZES)
async def test_help_scrolls_to_its_last_row(size) -> None:
    app = session_app()
    async with app.run_test(size=size) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        box = app.screen.query_one("#help-box")
        end = app.screen.query_one("#help-end")
        assert box.region.bottom <= size[1] and box.region.right <= size[0]
        for _ in range(20):
            await pilot.press("pagedown")
        await pilot.pause()
        assert box.scroll_y == box.max_scroll_y
        assert box.region.contains_region(end.region)  # the last row is in view
        await pilot.press("escape")
        assert type(app.screen).__name__ != "HelpScreen"


async def test_the_current_lane_is_framed_and_l_moves_the_frame() -> None:
    app = session_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        a, b = app.query_one("#lane-a"), app.query_one("#lane-b")
        assert a.has_class("focused") and not b.has_class("focused")
        assert "current" in str(a.border_title) and "current" not in str(b.border_title)
        await pilot.press("l")
        assert b.has_class("focused") and not a.has_class("focused")
        await open_input(app, pilot, "#prompt")
        assert not b.has_class("focused") and b.has_class("current")  # unlit, still current


def test_counts_take_the_noun_in_the_right_number() -> None:
    from specdiff.fork_words import counted

    assert [counted(n, "token") for n in (0, 1, 2, 11)] == [
        "0 tokens",
        "1 token",
        "2 tokens",
        "11 tokens",
    ]


async def test_stats_lines_cut_only_between_whole_parts() -> None:
    app = session_app()
    async with app.run_test(size=(80, 24)) as pilot:
        for path in DEMO_SESSIONS:
            drive(app).show_session(load_session(path))
            await pilot.pause()
            for lane_id in ("a", "b"):
                parts = drive(app).stats_line(lane_id).split(" · ")
                for width in range(8, 90):
                    shown = drive(app).stats_line(lane_id, width).split(" · ")
                    assert shown == parts[: len(shown)]
                    assert len(" · ".join(shown)) <= width or len(shown) == 1


def test_every_presets_header_names_a_value_for_each_key() -> None:
    from specdiff.lanes import LANE_KEYS, headline

    for pair in presets().values():
        for lane, other in ((pair.a, pair.b), (pair.b, pair.a)):
            for part in headline(lane, other).split(" · "):
                assert part.strip() not in LANE_KEYS, (pair.name, part)


def token_in_view(app: SpecdiffApp, lane_id: str, index: int) -> bool:
    view = app.query_one(f"#lane-{lane_id} TokenView", TokenView)
    index = min(index, len(drive(app).lanes[lane_id].steps) - 1)
    rows = [row for row, line in enumerate(view.lines) if any(i == index for i, _ in line)]
    top = round(view.scroll_offset.y)
    return bool(rows) and top <= rows[0] < top + view.size.height


def fork_in_view(app: SpecdiffApp) -> bool:
    """Both panes show the token where the lanes fork."""
    fork = drive(app).fork
    return fork is not None and all(token_in_view(app, lane, fork.index) for lane in "ab")


def cut_before_the_fork(path: Path, target: Path) -> Path:
    """The session with the steps from its fork on left out (and no footer): lanes that
    agree on every token shown."""
    session = load_session(path)
    fork = compare(session.steps["a"], session.steps["b"]).fork
    assert fork is not None
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        step_before = record["type"] == "step" and record["index"] < fork.index
        if record["type"] == "header" or step_before:
            kept.append(line)
    target.write_text("\n".join(kept) + "\n", encoding="utf-8")
    return target


@pytest.mark.parametrize("speed", [None, 1000.0])
async def test_a_fork_is_shown_in_both_panes_and_none_is_never_promised(tmp_path, speed) -> None:
    """Each demo session: its fork scrolled into view in both panes; cut before the
    fork, no status line speaks of jumping to one."""
    app = session_app(speed=speed)
    async with app.run_test(size=(80, 24)) as pilot:
        for path in DEMO_SESSIONS:
            for forked in (True, False):
                shown = path if forked else cut_before_the_fork(path, tmp_path / path.name)
                drive(app).show_session(load_session(shown))
                await wait_for(pilot, lambda: drive(app).played_out, 20)
                await pilot.pause()  # what the end of the replay posted is handled
                status = app.query_one("#status").plain
                if not forked:
                    assert drive(app).fork is None and "jumps to the fork" not in status
                    continue
                assert drive(app).fork is not None and "d jumps to the fork" in status
                # the panes scroll once laid out, which a busy machine can delay a while
                await wait_for(pilot, lambda: fork_in_view(app), 20)


@pytest.mark.parametrize(("speed", "paths"), [(4.0, DEMO_SESSIONS[:1]), (1000.0, DEMO_SESSIONS)])
async def test_pause_at_fork_stops_with_the_fork_on_screen(speed, paths) -> None:
    """At a pace that shows a step per frame and one that shows a whole session in a
    frame (the steps past the fork go back to the playback)."""
    app = session_app(speed=speed, pause_at_fork=True)
    async with app.run_test(size=(80, 24)) as pilot:
        for path in paths:
            recorded = load_session(path)
            fork = compare(recorded.steps["a"], recorded.steps["b"]).fork
            assert fork is not None
            drive(app).show_session(recorded)  # a session shown anew pauses at its own fork
            await wait_for(pilot, lambda: drive(app).played_out or drive(app).playback.paused, 30)
            await pilot.pause()
            assert drive(app).playback.paused and drive(app).fork is not None
            assert drive(app).fork.index == fork.index
            for lane_id in ("a", "b"):
                wanted = min(fork.index + 1, len(recorded.steps[lane_id]))
                assert len(drive(app).lanes[lane_id].steps) == wanted
            await wait_for(pilot, lambda: fork_in_view(app), 20)
            status = app.query_one("#status").plain
            assert status.startswith("REPLAY ") and "· paused at the fork: space resumes" in status
            await pilot.press("space")
            await wait_for(pilot, lambda: drive(app).playback.finished, 30)
            assert not drive(app).playback.paused  # it paused once, not at every later step


def test_the_replay_command_takes_pause_at_fork_and_a_slow_speed() -> None:
    from specdiff.cli import build_parser
    from specdiff.cli.replay import open_for_replay, replay_app

    args = build_parser().parse_args(["replay", str(SESSION), "--pause-at-fork", "--speed", "0.25"])
    session, stream = open_for_replay(args.session)
    try:
        app = replay_app(session, stream, args)
    finally:
        stream.close()
    assert drive(app).replay.pause_at_fork and drive(app).replay.speed == 0.25


@pytest.mark.parametrize("speed", [None, 1000.0])
async def test_a_replay_is_not_replaced_on_one_key(speed) -> None:
    app = session_app(speed=speed)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: drive(app).played_out, 20, "the replay's end")
        await pilot.pause()
        for selector in ("#run", "#stop", "#lane-a-overrides", "#lane-b-overrides"):
            assert app.query_one(selector).disabled, selector
        await pilot.press("r")
        assert not drive(app).running and drive(app).session is not None
        assert "press r again" in app.query_one("#status").plain
        # the second r runs: here it is refused at once (max tokens 0), so no model loads
        app.query_one("#max-tokens").value = "0"
        await pilot.press("r")
        assert "not started: max tokens must be at least 1" in app.query_one("#status").plain


async def test_e_writes_the_html_report_and_names_it(tmp_path) -> None:
    app = session_app(sessions_dir=tmp_path / "out")
    async with app.run_test(size=(80, 24)) as pilot:
        for path in DEMO_SESSIONS:
            drive(app).show_session(load_session(path))
            await pilot.pause()
            await pilot.press("e", "e")
            await pilot.pause()
            written = sorted((tmp_path / "out").glob(f"{path.stem}*.html"))
            assert [p.name for p in written] == [f"{path.stem}-2.html", f"{path.stem}.html"]
            assert written[0].name in app.query_one("#status").plain
            assert written[1].read_text(encoding="utf-8").lstrip().lower().startswith("<!doctype")


async def test_e_with_nothing_to_report_says_so(tmp_path) -> None:
    app = make_app(presets(), "ubatch", "Hi", 20, autostart=False, sessions_dir=tmp_path)
    notes: list[str] = []
    notify = app.notify
    app.notify = lambda message, **options: (notes.append(message), notify(message, **options))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("e")
        assert any("nothing to report yet" in note for note in notes)
        assert list(tmp_path.iterdir()) == []


async def test_a_screenshot_needs_no_downloads_folder(tmp_path, monkeypatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.chdir(tmp_path)  # no ./sessions here: the user data folder is used
    app = session_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        app.deliver_screenshot()
        await wait_for(pilot, lambda: list(home.rglob("*.svg")), 10)
    (shot,) = home.rglob("*.svg")
    assert shot.parent.name == "screenshots" and not (home / "Downloads").exists()


@pytest.mark.parametrize("size", SIZES)
async def test_notes_never_cover_the_panel(size) -> None:
    from textual.widgets._toast import Toast

    app = session_app()
    async with app.run_test(size=size, notifications=True) as pilot:
        for number in range(4):
            app.notify(f"note {number} " + "with a long text " * 12, severity="error")
        await wait_for(pilot, lambda: toasts_laid_out(app), 10, "the notes laid out")
        await pilot.pause()
        panel = app.query_one("#panel").region
        toasts = list(app.screen.query(Toast))
        assert toasts
        for toast in toasts:
            assert not toast.region.overlaps(panel), (toast.region, panel)


@pytest.mark.parametrize(("typo", "meant"), [("nubatch", "n_ubatch"), ("theads", "threads")])
async def test_an_unknown_override_key_gets_a_did_you_mean(typo, meant) -> None:
    app = idle_app("Hello")
    notes: list[str] = []
    notify = app.notify
    app.notify = lambda message, **options: (notes.append(message), notify(message, **options))
    async with app.run_test(size=(120, 40)) as pilot:
        app.query_one("#lane-a-overrides").value = f"{typo}=2"
        drive(app).run()
        await pilot.pause()
        assert f"did you mean {meant}" in notes[-1] and not drive(app).running
        assert "known keys" not in notes[-1]
    done = subprocess.run(
        [sys.executable, "-m", "specdiff", "run", "--prompt", "Hi", "--lane-a", f"{typo}=2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"did you mean {meant}" in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.model
@pytest.mark.parametrize("lane_id", ["a", "b"])
def test_a_lane_whose_model_is_missing_is_named_by_the_engine(lane_id: str, tmp_path) -> None:
    """The failure carries its lane, read by the pane that shows it: no error text is
    parsed for a lane's name (a model path may hold "lane a" itself)."""
    from dataclasses import replace

    from specdiff.engine.worker import PairWorker
    from specdiff.errors import ModelError

    base = presets()["ubatch"]
    missing = str(tmp_path / "lane a" / "missing.gguf")
    pair = replace(base, **{lane_id: replace(getattr(base, lane_id), model=missing)})
    with pytest.raises(ModelError) as raised:
        PairWorker(pair).close()
    assert raised.value.lane == lane_id
    assert missing in str(raised.value)


def test_every_pair_in_the_picker_fits_one_line_and_leads_with_its_name() -> None:
    from rich.cells import cell_len

    from specdiff.tui.controls import PAIR_OPTION_WIDTH, pair_option

    for name, pair in presets().items():
        row = pair_option(name, pair)
        assert row.plain.startswith(f"{name}  ") and cell_len(row.plain) <= PAIR_OPTION_WIDTH
        assert row.no_wrap


# -- what a new user found under tmux at 80x24 -------------------------------------------


def cut_session(path: Path, target: Path, steps: int) -> Path:
    """The session with each lane's first `steps` steps only (and no footer)."""
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if record["type"] == "header" or (record["type"] == "step" and record["index"] < steps):
            kept.append(line)
    target.write_text("\n".join(kept) + "\n", encoding="utf-8")
    return target


@pytest.mark.parametrize(
    ("speed", "other_key"),
    [(None, "right"), (1000.0, "n"), (None, "t"), (1000.0, "question_mark")],
)
async def test_any_other_key_disarms_a_pending_r(speed, other_key) -> None:
    """Shown whole and played: a navigation key, a theme key, a modal in between."""
    app = session_app(speed=speed)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: drive(app).played_out, 20, "the replay's end")
        await pilot.pause()
        before = app.query_one("#status").plain
        await pilot.press("r")
        assert "press r again" in app.query_one("#status").plain
        await pilot.press(other_key)
        if other_key == "question_mark":
            await pilot.press("escape")
        await pilot.pause()
        status = app.query_one("#status").plain
        assert "press r again" not in status
        assert status.split(" · ")[-1] == before.split(" · ")[-1]  # the replay's own status
        await pilot.press("r")  # asks again: the replay is still there
        assert drive(app).session is not None and not drive(app).running
        assert "press r again" in app.query_one("#status").plain


async def test_a_pending_r_is_disarmed_after_a_while(monkeypatch) -> None:
    import specdiff.tui.replay as replay_module

    # long enough that a loaded machine reads the status before the confirm runs out
    monkeypatch.setattr(replay_module, "CONFIRM_SECONDS", 2.0)
    app = session_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("r")
        assert "press r again" in app.query_one("#status").plain
        await wait_for(
            pilot,
            lambda: "press r again" not in app.query_one("#status").plain,
            10,
            "the pending r to be disarmed",
        )
        await pilot.press("r")
        assert drive(app).session is not None and "press r again" in app.query_one("#status").plain


def toasts_laid_out(app: SpecdiffApp) -> bool:
    """Every note's toast is on screen with its place worked out."""
    from textual.widgets._toast import Toast

    toasts = list(app.screen.query(Toast))
    return bool(toasts) and all(toast.region.area for toast in toasts)


def panel_lines(app: SpecdiffApp) -> str:
    return " ".join(str(item) for item in app.query_one("#panel").render().renderables)


@pytest.mark.parametrize("path", DEMO_SESSIONS[:2])
async def test_the_fork_header_counts_the_tokens_shown_as_they_grow(path) -> None:
    """A replay past its fork: the panel's count follows the lanes, and reads as a count
    beside the fork's index, never as "index of count"."""
    app = session_app(path, speed=1000.0)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: drive(app).replayed, 30)
        shown = max(len(state.steps) for state in drive(app).lanes.values())
        await wait_for(pilot, lambda: f"· {shown} tokens shown" in panel_lines(app), 10)
        assert drive(app).fork is not None and drive(app).cursor == drive(app).fork.index
        assert f"FORK at token {drive(app).fork.index} · {shown} tokens shown" in panel_lines(app)
        assert " of " not in panel_lines(app).split("FORK", 1)[1].split("·", 1)[0]


@pytest.mark.parametrize("speed", [None, 1000.0])
async def test_the_cursor_is_on_the_fork_once_the_view_goes_there(speed) -> None:
    app = session_app(speed=speed)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: drive(app).played_out, 30)
        fork = drive(app).fork.index
        await wait_for(pilot, lambda: drive(app).cursor == fork, 10, "the cursor on the fork")
        await pilot.press("right")
        assert drive(app).cursor == fork + 1  # → goes on from the fork, not from token 0
        await pilot.press("left", "left")
        assert drive(app).cursor == fork - 1


@pytest.mark.parametrize("modal", ["question_mark", "ctrl+p"])
async def test_closing_a_modal_lights_the_current_lane_again(modal) -> None:
    app = session_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("l")
        await pilot.press(modal)
        await pilot.pause()
        assert app.screen is not app.screen_stack[0]
        await pilot.press("escape")
        await pilot.pause()
        assert app.focused is app.query_one("#lanes")
        assert app.query_one("#lane-b").has_class("focused")
        assert not app.query_one("#lane-a").has_class("focused")


@pytest.mark.parametrize("size", SIZES)
async def test_routine_notes_go_to_the_status_and_toasts_cover_no_text(size) -> None:
    from textual.widgets._toast import Toast

    app = session_app(pause_at_fork=True, speed=1000.0)
    async with app.run_test(size=size, notifications=True) as pilot:
        await wait_for(pilot, lambda: drive(app).playback.paused, 30)
        await pilot.press("t")
        await pilot.pause()
        assert app.query_one("#status").plain.startswith(f"theme {app.theme} · ")
        assert not list(app.screen.query(Toast))  # the fork found and the theme: no toast
        app.notify("an error " + "with a long text " * 12, severity="error")
        await wait_for(pilot, lambda: toasts_laid_out(app), 10, "the notes laid out")
        await pilot.pause()
        covered = [app.query_one("#panel").region]
        covered += [view.region for view in app.query(TokenView)]
        toasts = list(app.screen.query(Toast))
        assert toasts
        for toast in toasts:
            for region in covered:
                assert not toast.region.overlaps(region), (toast.region, region)


@pytest.mark.parametrize("size", [(80, 24), (99, 30), (120, 40)])
async def test_the_footer_shows_only_whole_keys(size) -> None:
    from rich.cells import cell_len

    app = session_app()
    async with app.run_test(size=size) as pilot:
        keys = await settled_footer(app, pilot)
        palette = keys["ctrl+p"].region
        assert palette.right <= size[0]
        for key in keys.values():
            if key is keys["ctrl+p"]:
                continue
            wanted = cell_len(key.key_display) + 1 + cell_len(key.description)
            assert key.region.right <= palette.x and key.region.width >= wanted, key.key
        assert "question_mark" in keys and "q" in keys


@pytest.mark.parametrize("size", SIZES)
async def test_status_lines_lead_with_the_keys(size) -> None:
    app = session_app()
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        # after what is on screen (a replay, and its file), what to press
        badge, keys = app.query_one("#status").plain.split(" · ", 1)
        assert badge.startswith("REPLAY ") and badge.endswith(".jsonl")
        assert keys.startswith("d jumps to the fork · ")


async def test_d_is_offered_only_where_there_is_a_fork(tmp_path) -> None:
    app = session_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert "d" in footer_keys(app)
        drive(app).show_session(load_session(cut_before_the_fork(SESSION, tmp_path / "same.jsonl")))
        await pilot.pause()
        assert drive(app).fork is None and "d" not in footer_keys(app)


async def test_overrides_from_the_command_line_show_in_their_fields() -> None:
    from specdiff.cli import build_parser
    from specdiff.cli.live import live_app

    args = build_parser().parse_args(
        ["live", "--no-start", "--pair", "ubatch", "--both", "threads=2", "--lane-a", "n_ctx=512"]
    )
    app = live_app(args)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        fields = {lane: app.query_one(f"#lane-{lane}-overrides").value for lane in "ab"}
        assert fields == {"a": "threads=2 n_ctx=512", "b": "threads=2"}
        labels = [str(label.render()) for label in app.query("#overrides .field-label")]
        assert labels == ["lane a overrides", "lane b overrides"]
        # the fields run what the command line asked
        pair, _prompt, _max = drive(app).resolve_pair()
        assert (pair.a.n_ctx, pair.a.threads, pair.b.threads) == (512, 2, 2)
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        drive(app).screen.controls.show_config()
        assert "a: threads=2 n_ctx=512 · b: threads=2" in app.query_one("#config-bar").plain


@pytest.mark.parametrize("theme", ["specdiff-dark", "specdiff-light", "specdiff-high-contrast"])
async def test_the_focused_pair_picker_is_lit_as_a_focused_input(theme) -> None:
    app = make_app(presets(), "ubatch", "Hi", 20, autostart=False, theme_name=theme)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        current = app.query_one("#pair SelectCurrent")
        resting = current.styles.background
        app.query_one("#pair").focus()
        await pilot.pause()
        lit, bar = current.styles.background, current.styles.border_left[0]
        app.query_one("#prompt").focus()
        await pilot.pause()
        assert lit != resting and lit == app.query_one("#prompt").styles.background
        assert bar == app.query_one("#prompt").styles.border_left[0] != ""  # the accent bar
        assert current.styles.border_left[0] == ""  # unlit again once focus leaves


@pytest.mark.parametrize(
    "given",
    [
        ["--lane-a", "label=llama-server --spec-type ngram-simple"],  # serve-pair's labels
        ["--lane-a", 'label=it\'s quoted "twice" C:\\new'],
        ["--both", "label=both lanes", "--lane-a", "label=lane a's own"],
        ["--lane-a", 'request={"cache_prompt": true, "seed": 0}', "--lane-a", "label=x y"],
    ],
)
async def test_override_values_with_spaces_survive_the_overrides_field(given: list[str]) -> None:
    """The command line's overrides are shown in the field and read back as the same
    settings: a value keeps its spaces, quotes and backslashes."""
    from specdiff.cli import build_parser
    from specdiff.cli.live import live_app
    from specdiff.errors import SpecdiffError

    args = build_parser().parse_args(["live", "--no-start", "--pair", "ubatch", *given])
    app = live_app(args)
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.pause()
        app.query_one("#lane-a-overrides").value = app.query_one("#lane-a-overrides").value
        settings = dict(word.partition("=")[::2] for word in given if "=" in word)
        field_pair, _, _ = drive(app).resolve_pair()
        for key, value in settings.items():
            assert getattr(field_pair.a, key) == value, key
        # typed into the field alone, on the preset (not the command line's pair)
        drive(app).pairs["ubatch"] = presets()["ubatch"]
        field_pair, _, _ = drive(app).resolve_pair()
        for key, value in settings.items():
            assert getattr(field_pair.a, key) == value, key
        app.query_one("#lane-b-overrides").value = "n_ubatch=2 oops"
        with pytest.raises(SpecdiffError, match="^lane b overrides: .*'n_ubatch'"):
            drive(app).resolve_pair()


async def test_the_palette_offers_specdiffs_commands_each_with_its_key() -> None:
    """Only specdiff's own commands (none of Textual's generic ones), each naming the key
    that does the same; while the palette's input has the keys, quit is shown once."""
    from textual.widgets import OptionList

    from specdiff.tui.app import PALETTE_COMMANDS

    app = session_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("ctrl+p")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "CommandPalette", 10)
        options = app.screen.query_one(OptionList)
        await wait_for(pilot, lambda: options.option_count == len(PALETTE_COMMANDS), 10)
        titles = {
            str(options.get_option_at_index(n).prompt).split("\n")[0]
            for n in range(options.option_count)
        }
        assert {"Run (r)", "Jump to the fork (d)", "Help (?)", "Quit (q)"} <= titles
        assert all(title.endswith(")") for title in titles), titles
        quits = [key for key in app.query("FooterKey") if key.description == "quit"]
        assert len(quits) == 1 and quits[0].key == "ctrl+q"


async def test_help_opens_with_how_to_close_and_scroll_it() -> None:
    from specdiff.tui.help import END_ROW

    app = idle_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        box = app.screen.query_one("#help-box")
        first = app.screen.query_one("#help-start")
        assert str(first.render()) == END_ROW
        assert box.region.y < first.region.y < box.region.bottom  # on the first page


async def test_help_defines_every_glossary_word() -> None:
    from rich.console import Console
    from textual.widgets import Static

    from specdiff.glossary import GLOSSARY

    app = idle_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        console = Console(width=118, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
        for static in app.screen.query(Static):
            console.print(static.content)
        shown = " ".join(console.export_text().split())
    assert "words used here" in shown
    for term in GLOSSARY:
        assert term.name in shown and " ".join(term.definition.split()[:6]) in shown


@pytest.mark.parametrize("size", [(80, 24), (200, 50)])
async def test_each_panes_scrollbar_sits_against_its_frame(size) -> None:
    app = session_app()
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        for lane_id in ("a", "b"):
            pane = app.query_one(f"#lane-{lane_id}")
            view = app.query_one(f"#lane-{lane_id} TokenView", TokenView)
            assert view.region.width == pane.content_region.width
            assert view.vertical_scrollbar.region.right == pane.content_region.right


async def test_the_opened_controls_fit_80_columns() -> None:
    """`c` at 80 columns: the prompt has a label and a row of its own (its start on
    show), the closed pair picker shows the pair's name whole, and its list opens inside
    the screen."""
    from textual.widgets import Input, Select, Static

    app = session_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("c")
        await pilot.pause()
        prompt = app.query_one("#prompt", Input)
        label = app.query_one("#prompt-row .field-label", Static)
        assert str(label.render()) == "prompt" and label.region.right <= prompt.region.x
        assert label.region.y == prompt.region.y and prompt.region.width >= 50
        pair = app.query_one("#pair", Select)
        assert pair.region.x == 0 and pair.region.y == prompt.region.y + 1
        shown = str(pair.query_one("SelectCurrent #label", Static).render())
        assert shown == drive(app).session.pair.name
        pair.focus()
        await pilot.press("enter")
        await pilot.pause()
        overlay = pair.query_one("SelectOverlay")
        assert overlay.display and overlay.region.right <= 80
