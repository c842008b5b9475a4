"""The compare screen's `w`: the fork autopsy in the panel's place.

The record shown is tests/data/ubatch-roman-empire.autopsy.json, written by
`specdiff explain tests/data/ubatch-roman-empire.jsonl --max-runs 3 --save` on the
bundled model; showing it loads no model. Only the cancel test starts the engine.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specdiff.autopsy import Autopsy, AutopsyError, load_saved, save_beside, saved_beside
from specdiff.sessions.store import load_session
from specdiff.tui.app import SpecdiffApp
from specdiff.tui.widgets.autopsy_panel import AutopsyPanel, first_difference_text, growth_values
from specdiff.tui.widgets.line import Line
from tests.conftest import wait_for
from tests.tui_driver import drive, rendered_lines, session_app

DATA = Path(__file__).parent / "data"
SESSION = DATA / "ubatch-roman-empire.jsonl"
SAVED = saved_beside(SESSION)
SIZES = [(80, 24), (200, 50)]


def status(app: SpecdiffApp) -> str:
    return app.screen.query_one("#status", Line).plain


def autopsy_open(app: SpecdiffApp) -> bool:
    panels = list(app.screen.query(AutopsyPanel))
    return bool(panels) and bool(panels[0].display)


async def every_line_of_the_panel(app: SpecdiffApp, pilot) -> list[str]:
    """What the autopsy panel shows, scrolled through from top to bottom: each row of its
    content once."""
    panel = app.screen.query_one(AutopsyPanel)
    seen: dict[int, str] = {}
    top = 0
    while True:
        panel.scroll_to(y=top, animate=False)
        await pilot.pause()
        # the text only: the scrollbar's column is left out
        region = panel.scrollable_content_region
        shown = round(panel.scroll_offset.y)
        lines = rendered_lines(app)[region.y : region.bottom]
        for row, line in enumerate(lines):
            seen[shown + row] = line[region.x : region.right]
        if top >= panel.max_scroll_y:
            return [seen[row] for row in sorted(seen)]
        top += region.height


@pytest.mark.tui
@pytest.mark.parametrize("size", SIZES)
async def test_a_saved_autopsy_fills_the_panel_and_fits(size) -> None:
    """w over the replay: the cause, the settings table, the first tensor and the
    sparkline, each whole at the screen's width; w again gives the panel back."""
    pair = load_session(SESSION).pair
    # shown with what the session's lanes did before the fork, which the record lacks
    autopsy = load_saved(SAVED).with_lanes(pair.a, pair.b)
    assert autopsy.first_difference is not None, "the committed record names no tensor"
    app = session_app(SESSION)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        await pilot.press("w")
        await wait_for(pilot, lambda: autopsy_open(app), 10)
        assert not app.screen.query_one("#panel").display, "the divergence panel stays beside it"
        panel = app.screen.query_one(AutopsyPanel)
        assert panel.autopsy == autopsy
        assert panel.region.right <= size[0] and panel.region.bottom <= size[1]
        text = "\n".join(await every_line_of_the_panel(app, pilot))
        flat = " ".join(text.split())
        assert " ".join(autopsy.cause().split()) in flat, "the cause is not shown whole"
        for trial in autopsy.trials:
            assert trial.outcome in text, f"the table cut {trial.outcome!r}"
        first = autopsy.first_difference
        assert f"first differing tensor: {first.name}" in flat
        sparkline = app.screen.query_one("#autopsy-growth")
        assert list(sparkline.data) == growth_values(autopsy)
        assert len(sparkline.data) == len(autopsy.layers) + 1
        assert any(
            set(line.strip()) <= set("▁▂▃▄▅▆▇█") and line.strip() for line in text.splitlines()
        )
        # the lanes keep rows of their own
        assert app.screen.query_one("#lane-a").region.height >= 3
        await pilot.press("w")
        await pilot.pause()
        assert not autopsy_open(app)
        assert app.screen.query_one("#panel").display


@pytest.mark.tui
async def test_escape_closes_a_shown_autopsy() -> None:
    app = session_app(SESSION)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("w")
        await wait_for(pilot, lambda: autopsy_open(app), 10)
        await pilot.press("escape")
        await pilot.pause()
        assert not autopsy_open(app)


def session_copy(tmp_path: Path, change_lanes: dict[str, object] | None = None) -> Path:
    """The committed session in a folder of its own (no autopsy beside it), its lanes
    changed as given."""
    lines = SESSION.read_text(encoding="utf-8").splitlines()
    header = json.loads(lines[0])
    for lane in header["lanes"].values():
        lane.update(change_lanes or {})
    target = tmp_path / "run.jsonl"
    target.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n", encoding="utf-8")
    return target


def cut_before_the_fork(path: Path) -> Path:
    session = load_session(path)
    fork = session.comparison().fork
    assert fork is not None
    kept = [
        line
        for line in path.read_text(encoding="utf-8").splitlines()
        if json.loads(line)["type"] == "header"
        or (json.loads(line)["type"] == "step" and json.loads(line)["index"] < fork.index)
    ]
    path.write_text("\n".join(kept) + "\n", encoding="utf-8")
    return path


@pytest.mark.tui
async def test_w_on_lanes_that_agree_says_so(tmp_path) -> None:
    app = session_app(cut_before_the_fork(session_copy(tmp_path)))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("w")
        await pilot.pause()
        assert "nothing to explain" in status(app)
        assert not autopsy_open(app)
        assert not drive(app).autopsy_running


@pytest.mark.tui
async def test_w_on_server_lanes_says_so(tmp_path) -> None:
    path = session_copy(tmp_path, {"backend": "server", "endpoint": "http://127.0.0.1:9/v1"})
    app = session_app(path)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("w")
        await pilot.pause()
        assert "in-process lanes only" in status(app)
        assert not autopsy_open(app)
        assert not drive(app).autopsy_running


@pytest.mark.tui
async def test_w_on_a_session_whose_model_is_gone_says_so(tmp_path) -> None:
    path = session_copy(tmp_path, {"model": str(tmp_path / "gone.gguf")})
    app = session_app(path)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("w")
        await pilot.pause()
        assert "gone.gguf is missing" in status(app)
        assert not autopsy_open(app)
        assert not drive(app).autopsy_running


@pytest.mark.tui
async def test_a_saved_autopsy_of_another_pair_is_not_shown(tmp_path) -> None:
    path = session_copy(tmp_path, {"model": str(tmp_path / "gone.gguf")})
    record = json.loads(SAVED.read_text(encoding="utf-8"))
    record["pair"] = "spec-vs-plain"
    saved_beside(path).write_text(json.dumps(record), encoding="utf-8")
    app = session_app(path)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("w")
        await pilot.pause()
        assert not autopsy_open(app)
        assert "missing" in status(app), "it went on to the model, which is gone"


@pytest.mark.tui
@pytest.mark.model
async def test_an_autopsy_being_made_stops_on_w_and_on_escape(tmp_path) -> None:
    """The engine starts in its worker process; either key stops it within moments (a
    whole autopsy takes minutes), and the divergence panel comes back."""
    app = session_app(session_copy(tmp_path))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        for key in ("w", "escape"):
            await pilot.press("w")
            await wait_for(pilot, lambda: autopsy_open(app), 10)
            assert drive(app).autopsy_running
            assert app.screen.query_one("#autopsy-progress").display
            await pilot.press(key)
            await wait_for(pilot, lambda: not drive(app).autopsy_running, 60)
            assert status(app) == "autopsy stopped"
            assert not autopsy_open(app)
            assert app.screen.query_one("#panel").display


def test_the_palette_and_help_offer_w() -> None:
    from specdiff.tui.app import PALETTE_COMMANDS
    from specdiff.tui.help import HELP_ROWS
    from specdiff.tui.screen import CompareScreen

    assert "explain" in [action for _, _, action in PALETTE_COMMANDS]
    assert "w" in [key for key, _ in HELP_ROWS]
    assert ("w", "explain") in [(b.key, b.action) for b in CompareScreen.BINDINGS]


def test_a_saved_autopsy_reads_back_as_it_was_written(tmp_path) -> None:
    autopsy = load_saved(SAVED)
    session = tmp_path / "run.jsonl"
    shutil.copy(SESSION, session)
    written = save_beside(session, autopsy)
    assert written == tmp_path / "run.autopsy.json"
    assert load_saved(written) == autopsy
    assert Autopsy.from_json(json.loads(SAVED.read_text(encoding="utf-8"))) == autopsy


@pytest.mark.parametrize(
    ("content", "said"), [(b"\xff\xfe", "not JSON"), (b"{}", "autopsy"), (b"[1]", "autopsy")]
)
def test_a_broken_saved_autopsy_is_one_line(tmp_path, content: bytes, said: str) -> None:
    path = tmp_path / "run.autopsy.json"
    path.write_bytes(content)
    with pytest.raises(AutopsyError, match=said):
        load_saved(path)


def test_save_without_a_session_is_refused() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "specdiff", "explain", "--prompt", "Hi", "--save"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--save writes beside a session file" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def history_record() -> Autopsy:
    """The committed record with its first differing tensor turned into layer 11's K
    cache, differing in cells earlier decode calls wrote: what explain taps now."""
    data = json.loads(SAVED.read_text(encoding="utf-8"))
    first = next(entry for entry in data["tensors"] if not entry["identical"])
    first.update(name="cache_k_l11", op="SET_ROWS", kv_history=True)
    return Autopsy.from_json(data)


def test_the_first_tensor_line_says_kv_history_where_earlier_calls_wrote_it() -> None:
    shown = first_difference_text(history_record())
    assert shown.startswith("first differing tensor: cache_k_l11 (layer 11, SET_ROWS)")
    assert "KV history: written by earlier decode calls" in shown
    assert "SET_ROWS is a write into the KV cache" in shown
    assert "KV history" not in first_difference_text(load_saved(SAVED))


@pytest.mark.tui
async def test_w_shows_a_first_difference_in_the_caches_history(tmp_path) -> None:
    session = session_copy(tmp_path)
    save_beside(session, history_record())
    app = session_app(session)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("w")
        await wait_for(pilot, lambda: autopsy_open(app), 10)
        flat = " ".join("\n".join(await every_line_of_the_panel(app, pilot)).split())
        assert "first differing tensor: cache_k_l11 (layer 11, SET_ROWS)" in flat
        assert "KV history: written by earlier decode calls" in flat
        assert "The first difference is in layer 11's K cache (cache_k_l11)" in flat
