"""`specdiff proxy --tui`: the app follows the proxy's suite folder, showing each pair
the moment it is saved, with the count of requests and forks; without a terminal the
option is refused before anything loads."""

from __future__ import annotations

import shutil
import threading
from functools import partial
from pathlib import Path

import pytest

from specdiff.cli import main
from specdiff.compare import DEFAULT_NEAR_TIE
from specdiff.proxy.folder import Recorded
from specdiff.proxy.progress import ProxyTally
from specdiff.sessions.store import load_session
from specdiff.suite.records import read_record
from specdiff.tui.proxy_app import NOT_HERE, ProxyApp, make_proxy_app
from tests.conftest import ROOT, wait_for
from tests.tui_driver import drive, rendered_lines

SAVED = (
    ROOT / "sessions" / "20261129T095647Z-spec-vs-plain-cd1458d9.jsonl",
    ROOT / "tests" / "data" / "ubatch-roman-empire.jsonl",
)
ENDPOINT = "http://127.0.0.1:8090/v1"


def save_into(report: Path, source: Path, tally: ProxyTally) -> Recorded:
    """`source` saved into the suite folder as the proxy saves a pair: its session under
    sessions/PAIR/, and its record read back from the file."""
    session = load_session(source)
    relative = f"sessions/{session.pair.name}/{source.name}"
    target = report / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    read = read_record(target, relative, session.pair.name, "", source.stem, DEFAULT_NEAR_TIE)
    assert not isinstance(read, str), read
    record = read[0]
    return Recorded(record, tally.requests + 1, tally.forked)


def shows(app: ProxyApp, text: str) -> bool:
    return any(text in row for row in rendered_lines(app))


def showing(app: ProxyApp, source: Path) -> bool:
    """The session on screen is (a copy of) `source`."""
    session = drive(app).session
    return session is not None and session.path.name == source.name


@pytest.mark.tui
async def test_the_app_shows_each_pair_saved_with_the_counts(tmp_path: Path) -> None:
    pair = load_session(SAVED[0]).pair
    app = make_proxy_app(pair, 64, ENDPOINT)
    tally = ProxyTally()
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_for(pilot, lambda: shows(app, "0 requests · waiting for the first"),
                       what="the proxy's line")  # fmt: skip
        forks = 0
        for number, source in enumerate(SAVED, start=1):
            recorded = save_into(tmp_path, source, tally)
            # the service calls back from the thread that ran the pair
            saver = threading.Thread(
                target=lambda r=recorded: app.saved(tally.add(r, str(tmp_path)))
            )
            saver.start()
            saver.join()
            shown = load_session(source)
            forks += shown.comparison().fork is not None
            await wait_for(pilot, partial(showing, app, source), what=f"pair #{number}")
            line = f"{number} request{'s' if number > 1 else ''} · {forks} forked"
            line = f"proxy {ENDPOINT} · {line} · latest: #{number}"
            await wait_for(pilot, partial(shows, app, line), timeout=10, what=line)
            # shown at once, as a finished session: every step of both lanes
            for lane_id in ("a", "b"):
                assert len(drive(app).lanes[lane_id].steps) == len(shown.steps[lane_id])
            fork = shown.comparison().fork
            assert fork is not None and drive(app).fork is not None
            assert drive(app).fork.index == fork.index
        await pilot.press("q")
    assert app.return_code == 0


@pytest.mark.tui
async def test_r_does_not_run_the_proxy_pair_a_second_time(tmp_path: Path) -> None:
    pair = load_session(SAVED[0]).pair
    app = make_proxy_app(pair, 64, ENDPOINT)
    tally = ProxyTally()
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_for(pilot, app.ready.is_set, what="the proxy's screen")
        app.saved(tally.add(save_into(tmp_path, SAVED[0], tally), str(tmp_path)))
        await wait_for(pilot, lambda: drive(app).session is not None, what="the pair on screen")
        status = drive(app).status
        await pilot.press("r", "r")  # elsewhere, over a replay, the second r runs
        await pilot.pause()
        assert drive(app).status == status  # not even the question whether to run
        drive(app).run()  # as Enter in the prompt box or the palette's Run asks
        await wait_for(
            pilot,
            lambda: any(NOT_HERE in str(note.message) for note in app._notifications),
            timeout=10,
            what="the refusal",
        )
        assert not drive(app).running
        assert drive(app).worker_pid is None


def test_tui_without_a_terminal_is_refused_before_anything_loads(tmp_path: Path, capsys) -> None:
    report = tmp_path / "suite"
    code = main(["proxy", "--tui", "--port", "0", "--report", str(report)])
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "--tui needs a terminal" in lines[0] and "drop --tui" in lines[0]
    assert not report.exists()
