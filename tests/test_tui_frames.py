"""Streaming frames: a batch that arrives while the UI is over its CPU share is drawn
later, with the next batch or by a timer, and never lost."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import pytest

from specdiff.engine.base import LiveStats
from specdiff.lanes import presets
from specdiff.sessions.store import load_session
from specdiff.tui import app as app_module
from specdiff.tui import live
from specdiff.tui.app import make_app
from specdiff.tui.messages import StepsArrived
from specdiff.tui.widgets import Line, MarginStrip, TokenView
from tests.conftest import wait_for
from tests.tui_driver import drive

SESSIONS = sorted((Path(__file__).resolve().parent.parent / "sessions").glob("*.jsonl"))


LIVE = {"a": LiveStats(1.0), "b": LiveStats(1.0)}


def batch(steps: dict, start: int, end: int) -> StepsArrived:
    """Both lanes' steps from start to end, as the generation thread posts them."""
    return StepsArrived([*steps["a"][start:end], *steps["b"][start:end]], LIVE)


def laid_out(app: app_module.SpecdiffApp, lane_id: str) -> int:
    return len(app.query_one(f"#lane-{lane_id} TokenView", TokenView).token_lines)


@pytest.mark.tui
async def test_a_batch_held_back_from_a_frame_is_drawn_by_the_timer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    steps = load_session(SESSIONS[0]).steps
    monkeypatch.setattr(live, "FRAME_CPU_SHARE", 0.0)  # every frame after the first waits
    # longer than a pause on a busy machine (one took over 2 s with 2 cores loaded 4 deep);
    # the test waits for the timer, so a long gap costs only its own length
    monkeypatch.setattr(live, "FRAME_GAP_MAX", 5.0)
    app = make_app(presets(), "spec-vs-plain", "Hello", 20, autostart=False)
    async with app.run_test(size=(120, 40)) as pilot:
        drive(app).set_running(True)
        drive(app).post(batch(steps, 0, 10))
        await pilot.pause()
        assert laid_out(app, "a") == laid_out(app, "b") == 10
        drive(app).post(batch(steps, 10, 20))
        await pilot.pause()
        assert laid_out(app, "a") == 10  # held back: the UI used CPU since its last frame
        assert len(drive(app).lanes["a"].steps) == 20  # but kept
        # drawn at the latest FRAME_GAP_MAX after the last frame, by a timer
        await wait_for(pilot, lambda: laid_out(app, "b") == 20, 30, "the held-back frame")
        assert laid_out(app, "a") == 20


def stats_of(app: app_module.SpecdiffApp, lane_id: str) -> str:
    return app.query_one(f"#lane-{lane_id} .lane-stats", Line).plain


def strip_of(app: app_module.SpecdiffApp, lane_id: str) -> int:
    return len(app.query_one(f"#lane-{lane_id} MarginStrip", MarginStrip).margins)


@pytest.mark.tui
async def test_streaming_frames_draw_the_lanes_details_once_a_panel_period(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    steps = load_session(SESSIONS[0]).steps
    monkeypatch.setattr(live, "FRAME_CPU_SHARE", 1.0)  # every batch is a frame
    monkeypatch.setattr(live, "PANEL_SECONDS", 3.0)  # longer than a pause on a busy machine
    app = make_app(presets(), "spec-vs-plain", "Hello", 30, autostart=False)
    async with app.run_test(size=(120, 40)) as pilot:
        drive(app).set_running(True)
        drive(app).post(batch(steps, 0, 10))
        await pilot.pause()
        assert stats_of(app, "a").startswith("10 tokens") and strip_of(app, "a") == 10
        drive(app).post(batch(steps, 10, 20))
        await pilot.pause()
        # the tokens are drawn; their stats line and margin strip wait for the period
        assert laid_out(app, "a") == 20
        assert stats_of(app, "a").startswith("10 tokens") and strip_of(app, "a") == 10
        await asyncio.sleep(live.PANEL_SECONDS + 0.2)  # time passes, as it is the point
        drive(app).post(batch(steps, 20, 25))
        await pilot.pause()
        assert laid_out(app, "b") == 25
        assert stats_of(app, "b").startswith("25 tokens") and strip_of(app, "b") == 25


@pytest.mark.tui
@pytest.mark.model
async def test_objects_older_than_a_run_are_set_aside_from_collection_while_it_runs() -> None:
    app = make_app(presets(), "ubatch", "The capital of France is", 24)
    assert gc.get_freeze_count() == 0
    async with app.run_test(size=(120, 40)) as pilot:
        frozen_while_running = []

        def finished() -> bool:  # sampled every poll while the run goes on
            if drive(app).running:
                frozen_while_running.append(gc.get_freeze_count())
            return drive(app).result is not None

        await wait_for(pilot, finished, 300, "the run's end")
        assert frozen_while_running and min(frozen_while_running) > 0
        assert gc.get_freeze_count() == 0
        drive(app).run()  # quitting mid-run gives them back too
        assert drive(app).running and gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
