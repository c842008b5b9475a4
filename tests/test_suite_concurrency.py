"""`suite --concurrency N`: prompts side by side on server lanes, against real servers on
loopback (benchmarks/stream_server.py, whose pace and 429s are set per test, and a real
llama-server), each suite a real `python3 -m specdiff suite` process: the setting
recorded everywhere, a resume at another one refused, progress in a log, Ctrl+C that
drains and a second that stops, a busy server's back-off in the report."""

from __future__ import annotations

import csv
import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from specdiff.cli import main
from specdiff.sessions.store import load_session
from tests.servers import script_server

STREAM_SERVER = str(Path(__file__).parents[1] / "benchmarks" / "stream_server.py")
PROGRESS_LINE = re.compile(
    r"suite: \d+/\d+ \(\d+%\) · \d+ in flight · \d+\.\d\d prompts/s · \d+ tokens/s · "
    r"ETA (…|\d+s|\d+m\d\ds|\d+h\d\dm) · servers p\d+"
)


def write_prompts(folder: Path, count: int) -> Path:
    prompts = folder / "prompts.jsonl"
    lines = [json.dumps({"id": f"p{n}", "prompt": f"Say hello, number {n}"}) for n in range(count)]
    prompts.write_text("\n".join(lines) + "\n")
    return prompts


def suite_command(prompts: Path | None, url: str, report: Path, *extra: str) -> list[str]:
    """The suite over `prompts` on two server lanes at `url`; None: a --resume that
    takes everything from the stopped suite's suite.json."""
    if prompts is None:
        chosen = ["--resume", "--allow-servers"]
    else:
        lanes = ["--lane-a", f"endpoint={url}", "--lane-b", f"endpoint={url}"]
        chosen = [str(prompts), "--pair", "servers", *lanes, "--max-tokens", "8"]
    return [sys.executable, "-m", "specdiff", "suite", *chosen, "--report", str(report), *extra]


def run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)


def counts(url: str) -> dict[str, int]:
    """What the stream server did: completions streamed, 429s sent, the most at once."""
    return httpx.get(f"{url}/counts", timeout=10).json()


@pytest.fixture
def paced(request: pytest.FixtureRequest) -> Iterator[str]:
    """A stream server in the mode the test names (default: eight words, 50 ms apart)."""
    mode = getattr(request, "param", "tokens=8:delay=0.05")
    with script_server(STREAM_SERVER, mode) as url:
        yield url


def session_files(report: Path) -> list[Path]:
    return sorted((report / "sessions" / "servers").glob("*.jsonl"))


@pytest.mark.server
@pytest.mark.parametrize("concurrency", [1, 3])
def test_prompts_run_side_by_side_and_the_setting_is_recorded_everywhere(
    paced: str, tmp_path: Path, concurrency: int
) -> None:
    report = tmp_path / "report"
    done = run(
        suite_command(write_prompts(tmp_path, 6), paced, report, "--concurrency", str(concurrency))
    )
    assert done.returncode == 0, done.stderr
    files = session_files(report)
    assert [f.stem for f in files] == [f"p{n}" for n in range(6)]
    # both lanes stream at once in each run: two requests per prompt in flight
    peak = counts(paced)["peak"]
    assert peak <= 2 * concurrency and (peak > 2) == (concurrency > 1)
    assert json.loads((report / "suite.json").read_text())["concurrency"] == concurrency
    for file in files:
        executed = load_session(file).header.executed
        assert executed["a"]["concurrency"] == executed["b"]["concurrency"] == concurrency
    assert (
        f"concurrency {concurrency} (prompts in flight per lane)"
        in (report / "report.md").read_text()
    )
    assert f"At concurrency {concurrency}: identical" in (report / "report.html").read_text()
    rows = list(csv.DictReader((report / "results.csv").open()))
    assert len(rows) == 6 and {row["concurrency"] for row in rows} == {str(concurrency)}
    assert {row["served_by_a"] for row in rows} == {paced}
    assert f"concurrency {concurrency}" in done.stdout.splitlines()[0]


@pytest.mark.server
@pytest.mark.parametrize(
    ("with_prompts", "given"), [(True, 4), (False, 1)], ids=["with-prompts", "from-suite-json"]
)
def test_a_resume_at_another_concurrency_is_refused_in_one_line(
    paced: str, tmp_path: Path, with_prompts: bool, given: int
) -> None:
    report, prompts = tmp_path / "report", write_prompts(tmp_path, 2)
    first = run(suite_command(prompts, paced, report, "--concurrency", "2"))
    assert first.returncode == 0, first.stderr
    before = {f: f.stat().st_mtime_ns for f in report.rglob("*") if f.is_file()}
    resumed = run(
        suite_command(prompts if with_prompts else None, paced, report, "--concurrency", str(given))
        + (["--resume"] if with_prompts else [])
    )
    assert resumed.returncode == 2
    assert resumed.stderr.splitlines() == [
        f"specdiff: error: --concurrency {given} differs from the 2 the stopped suite in "
        f"{report} ran at (the split rate depends on the load); resume with "
        "--concurrency 2, or use a new --report dir"
    ]
    assert {f: f.stat().st_mtime_ns for f in report.rglob("*") if f.is_file()} == before


def refused(command: list[str], report: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The stderr lines of a suite that `main` refused with exit 2, touching nothing."""
    # in this process: the refusal comes before any model or server is reached
    code = main(command[3:])
    assert code == 2 and not report.exists()
    return capsys.readouterr().err.splitlines()


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        (["--concurrency", "0"], "argument --concurrency: must be from 1 to 256, got 0"),
        (["--concurrency", "-3"], "argument --concurrency: must be from 1 to 256, got -3"),
        (["--concurrency", "1.5"], "argument --concurrency: must be a whole number, got '1.5'"),
        (["--concurrency", "many"], "argument --concurrency: must be a whole number, got 'many'"),
        (["--concurrency", "257"], "argument --concurrency: must be from 1 to 256, got 257"),
        (["--max-retries", "11"], "argument --max-retries: must be from 0 to 10, got 11"),
    ],
)
def test_a_bad_setting_is_one_line_and_touches_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], problem: str
) -> None:
    report = tmp_path / "report"
    command = suite_command(write_prompts(tmp_path, 2), "http://127.0.0.1:9", report, *extra)
    assert refused(command, report, capsys) == [
        f"specdiff: error: {problem} (see: specdiff suite --help)"
    ]


@pytest.mark.parametrize("pair", ["ubatch", "spec-vs-plain", "cache-vs-fresh"])
@pytest.mark.parametrize("concurrency", ["2", "8"])
def test_concurrency_beside_an_in_process_lane_is_refused_before_anything_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pair: str, concurrency: str
) -> None:
    report = tmp_path / "report"
    command = [
        sys.executable, "-m", "specdiff", "suite", str(write_prompts(tmp_path, 2)),
        "--pair", pair, "--concurrency", concurrency, "--report", str(report),
    ]  # fmt: skip
    assert refused(command, report, capsys) == [
        f"specdiff: error: --concurrency {concurrency} needs server lanes, and pair {pair} "
        "runs a lane in process, one prompt at a time; drop --concurrency"
    ]


@pytest.mark.server
def test_a_log_gets_the_progress_figures_once_a_minute(paced: str, tmp_path: Path) -> None:
    done = run(
        suite_command(write_prompts(tmp_path, 6), paced, tmp_path / "r", "--concurrency", "4")
    )
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr
    figures = [line for line in done.stderr.splitlines() if PROGRESS_LINE.fullmatch(line)]
    # the first once a run has ended, the next a minute later: this suite takes seconds
    assert len(figures) == 1, done.stderr


class Watched:
    """A suite process whose stderr is read as it comes, so a test can act on a line."""

    def __init__(self, command: list[str]) -> None:
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern: str, seconds: float = 120) -> None:
        deadline = time.monotonic() + seconds
        while not any(re.search(pattern, line) for line in self.lines):
            assert time.monotonic() < deadline and self.process.poll() is None, self.lines
            time.sleep(0.02)

    def finish(self) -> int:
        code = self.process.wait(timeout=300)
        self.reader.join(timeout=30)
        return code


@pytest.mark.server
@pytest.mark.parametrize("paced", ["tokens=8:delay=0.15"], indirect=True)
@pytest.mark.parametrize("presses", [1, 2], ids=["drain", "stop-now"])
def test_ctrl_c_stops_the_suite_and_resume_finishes_it_with_nothing_lost_or_twice(
    paced: str, tmp_path: Path, presses: int
) -> None:
    report, prompts = tmp_path / "report", write_prompts(tmp_path, 8)
    suite = Watched(suite_command(prompts, paced, report, "--concurrency", "2"))
    suite.wait_for(r"^suite: 1/8 servers p\d ")
    suite.process.send_signal(signal.SIGINT)
    if presses == 2:
        suite.wait_for("^stopping: no new prompts")
        suite.process.send_signal(signal.SIGINT)
    assert suite.finish() == 130, suite.lines
    assert any(
        line.startswith("stopping: no new prompts; the runs in flight finish")
        for line in suite.lines
    )
    finished = [f.stem for f in session_files(report)]
    partial = list(report.rglob("*.partial"))
    if presses == 1:
        # the runs in flight finished: none was cut short
        assert partial == [] and 2 <= len(finished) < 8
    streamed_before = counts(paced)["streamed"]
    resumed = run(suite_command(None, paced, report, "--concurrency", "2"))
    assert resumed.returncode == 0, resumed.stderr
    assert [f.stem for f in session_files(report)] == [f"p{n}" for n in range(8)]
    assert list(report.rglob("*.partial")) == []
    # the resumed suite asked only for the runs that had not finished, both lanes each
    assert counts(paced)["streamed"] - streamed_before == 2 * (8 - len(finished))
    for file in session_files(report):
        session = load_session(file)
        assert [len(session.steps[lane]) for lane in "ab"] == [8, 8]
        assert [s.index for s in session.steps["a"]] == list(range(8))
    data = json.loads((report / "report.json").read_text())
    assert data["complete"] and sorted(r["prompt_id"] for r in data["prompts"]) == [
        f"p{n}" for n in range(8)
    ]


@pytest.mark.server
@pytest.mark.parametrize(
    "paced", ["tokens=4:busy=3:retry_after=1", "tokens=4:busy=1:retry_after=2"], indirect=True
)
def test_a_busy_server_s_429s_are_waited_out_and_the_back_off_is_in_the_report(
    paced: str, tmp_path: Path
) -> None:
    report = tmp_path / "report"
    done = run(suite_command(write_prompts(tmp_path, 3), paced, report, "--concurrency", "2"))
    assert done.returncode == 0, done.stderr
    busy, retry_after = (int(v.split("=")[1]) for v in paced_mode(paced))
    assert counts(paced)["busy"] == busy
    serving = json.loads((report / "report.json").read_text())["pairs"][0]["summary"]["serving"]
    assert sum(serving["retries"]) == busy
    # each 429 was waited out for at least its Retry-After (runs overlap: the least is one)
    assert sum(serving["wait_seconds"]) >= retry_after
    lanes = ", ".join(
        f"lane {lane} {serving['retries'][i]} retries, {serving['wait_seconds'][i]:.1f} s"
        for i, lane in enumerate("ab")
    )
    backoff = f"Back-off at concurrency 2: {lanes}."
    assert f"  {backoff}" in done.stdout.splitlines()
    assert backoff in (report / "report.md").read_text()


@pytest.mark.model
@pytest.mark.server
@pytest.mark.parametrize(
    ("paced", "concurrency"),
    [("tokens=8:broken=1", 2), ("tokens=8:broken=3", 3)],
    indirect=["paced"],
)
def test_a_run_sent_again_from_the_start_counts_only_its_kept_tokens(
    paced: str, concurrency: int, tmp_path: Path
) -> None:
    """The suite's tokens/s (what benchmarks/suite_concurrency.py holds against a bare
    client) counts the steps the sessions keep, never those of a broken attempt."""
    from specdiff.lanes import Lane, Pair
    from specdiff.suite.folder import write_settings
    from specdiff.suite.prompts import SuitePrompt
    from specdiff.suite.runner import FinishedRun, SuiteRun
    from specdiff.suite.settings import SuiteSettings

    prompts = [SuitePrompt(id=f"p{n}", prompt=f"Say hello, number {n}") for n in range(4)]
    lane = Lane(backend="server", endpoint=paced)
    settings = SuiteSettings(
        source="test",
        pairs=(Pair("servers", lane, lane, ""),),
        max_tokens=8,
        concurrency=concurrency,
    )
    write_settings(tmp_path, settings, prompts)
    finished: list[FinishedRun] = []
    outcome = SuiteRun(settings, prompts, tmp_path, on_finished=finished.append).run()
    assert outcome.finished_runs == len(prompts)
    broken = int(counts(paced)["mode"]["broken"])
    assert counts(paced)["broken"] == broken
    kept = sum(sum(record["generated"]) for record in outcome.ledger.records())
    assert kept == len(prompts) * 2 * 8
    assert max(run.progress.tokens for run in finished) == kept


@pytest.mark.server
@pytest.mark.parametrize("paced", ["tokens=4:first=0.5"], indirect=True)
@pytest.mark.parametrize("concurrency", ["1", "2"])
def test_both_lanes_of_a_prompt_send_their_requests_at_once(
    paced: str, concurrency: str, tmp_path: Path
) -> None:
    """Lanes stepped in turn must not hold lane b's request back until lane a's first
    token: both wait for their first token together, as a bare client's would."""
    report = tmp_path / "report"
    done = run(
        suite_command(write_prompts(tmp_path, 2), paced, report, "--concurrency", concurrency)
    )
    assert done.returncode == 0, done.stderr
    assert counts(paced)["peak_unanswered"] == 2 * int(concurrency)


def paced_mode(url: str) -> list[str]:
    """The busy and retry_after settings of the stream server at `url`."""
    settings = counts(url)["mode"]
    return [f"busy={settings['busy']:g}", f"retry_after={settings['retry_after']:g}"]


@pytest.mark.model
@pytest.mark.server
def test_two_llama_servers_per_lane_one_killed_mid_run_the_suite_completes_on_the_other(
    model_path: Path, tmp_path: Path
) -> None:
    """200 prompts at --concurrency 8, each lane spread over the same two llama-servers
    (--parallel 4 each); one is killed once the suite is under way."""
    from specdiff.engine.server.process import LlamaServer, find_llama_server

    arguments = ["--threads", "1", "--parallel", "4", "--no-cache-prompt"]
    binary = find_llama_server()
    count = 200
    report, prompts = tmp_path / "report", write_prompts(tmp_path, count)
    with (
        LlamaServer(binary, model_path, arguments) as kept,
        LlamaServer(binary, model_path, arguments) as killed,
    ):
        both = f"{killed.url},{kept.url}"
        command = suite_command(prompts, both, report, "--concurrency", "8")
        command[command.index("8")] = "4"  # --max-tokens: the load is in the prompts' number
        command += ["--both", "api=llama-server"]  # its own API gives the probabilities
        suite = Watched(command)
        suite.wait_for(rf"^suite: 2\d/{count} servers p\d+ ", seconds=240)
        assert killed.process is not None
        killed.process.kill()  # a crash: the runs streaming from it break mid-stream
        assert suite.finish() == 0, suite.lines[-20:]
        resumed = suite_command(prompts, both, report, "--concurrency", "2", "--resume")
        refused = run([*resumed, "--both", "api=llama-server"])
    assert refused.returncode == 2 and "--concurrency 2 differs from the 8" in refused.stderr
    assert sorted(f.stem for f in session_files(report)) == sorted(f"p{n}" for n in range(count))
    served = [load_session(f).footer.serving for f in session_files(report)]  # type: ignore[union-attr]
    assert all(s is not None and s[0] and s[1] for s in served)
    endpoints = {lane.endpoint for s in served for lane in s}  # type: ignore[union-attr]
    # both served before the kill, and only the one left after it
    assert endpoints == {kept.url, killed.url}
    summary = json.loads((report / "report.json").read_text())["pairs"][0]["summary"]
    assert summary["failed"] == 0 and summary["concurrency"] == 8
    assert summary["prompts"] == count
    # the runs the kill broke were sent again from the start: counted as retries
    assert sum(summary["serving"]["retries"]) >= 1
    rows = {row["endpoint"]: row for row in summary["serving"]["endpoints"][0]}
    assert rows[kept.url]["prompts"] > rows[killed.url]["prompts"] >= 1
