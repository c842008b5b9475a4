"""`r` with a new prompt runs on the lanes already loaded: the worker process that
loaded them answers again, and says nothing of loading (its own progress messages).
Only a change to a lane's settings loads the lanes again."""

from __future__ import annotations

import pytest

from specdiff.lanes import presets
from specdiff.tui.app import make_app
from tests.conftest import wait_for
from tests.tui_driver import drive


@pytest.mark.model
async def test_a_new_prompt_runs_on_the_lanes_already_loaded() -> None:
    app = make_app(presets(), "ubatch", "The sea", 4, autostart=False)
    async with app.run_test(size=(120, 40)) as pilot:
        statuses = drive(app).record_statuses()
        await pilot.press("r")
        await wait_for(pilot, lambda: drive(app).result is not None, 300)
        first = drive(app).worker_pid
        assert first is not None and any(text.startswith("loading lane") for text in statuses)
        statuses.clear()
        app.query_one("#prompt").value = "A cat"
        await pilot.press("r")
        screen = drive(app)
        await wait_for(
            pilot, lambda: screen.result is not None and screen.result.prompt == "A cat", 300
        )
        assert drive(app).worker_pid == first
        assert not [text for text in statuses if text.startswith("loading")], statuses
        # a lane's settings changed: that is a new pair, loaded in a new worker
        # one thread more than the lane's default, which is every core this process may
        # use (one, in a test run that gives each worker a core of its own)
        threads = drive(app).result.pair.b.threads + 1
        app.query_one("#lane-b-overrides").value = f"threads={threads}"
        statuses.clear()
        await pilot.press("r")
        await wait_for(pilot, lambda: drive(app).result is not None and not drive(app).running, 200)
        assert drive(app).result.pair.b.threads == threads, statuses
        assert any(text.startswith("loading lane") for text in statuses)
        assert drive(app).worker_pid not in (None, first)
