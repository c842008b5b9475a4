"""Text from a shared session, a server or a pairs file never acts on the terminal, a
Markdown renderer or a spreadsheet: every escape sequence, control character and bidi
override shows as a visible escape, Markdown cells stay text, CSV cells never start a
formula."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from markdown_it import MarkdownIt
from rich.text import Text
from textual.widgets import Static

from specdiff.cli.common import Status
from specdiff.lanes import presets
from specdiff.reports._markup import md_table
from specdiff.reports.suite import html_report, markdown, results_csv
from specdiff.safe_text import (
    GuardedStream,
    csv_cell,
    guarded_output,
    markdown_cell,
    terminal_text,
    visible,
)
from specdiff.sessions.store import load_session
from specdiff.suite.ledger import Ledger
from specdiff.suite.outcome import SuiteOutcome, outcome_json
from specdiff.suite.prompts import SuitePrompt
from specdiff.suite.records import record_from_session
from specdiff.suite.settings import SuiteSettings
from specdiff.tui.app import make_app
from specdiff.tui.widgets import TokenView
from tests.tui_driver import drive, rendered_lines

SESSION = Path(__file__).parent / "data" / "ubatch-roman-empire.jsonl"

HOSTILE = {
    "osc52 clipboard": "\x1b]52;c;aGk=\x07",
    "osc0 title": "\x1b]0;PWN\x07",
    "csi clear": "\x1b[2J",
    "c1 csi": "\x9b31m",
    "bel": "ring\x07",
    "carriage return": "real\rfake",
    "backspace": "abc\x08\x08\x08xyz",
    "del": "a\x7fb",
    "nul": "a\x00b",
    "bidi override": "user\u202etxt.exe",
    "bidi isolate": "a\u2066b\u2069",
    "line separator": "a\u2028b",
    "lone surrogate": "a\udc80b",
    "script": "<script>alert(1)</script>",
    "pipe": "a | b | c",
    "hyperlink formula": '=HYPERLINK("http://x.example","click")',
    "plus formula": "+cmd|' /C calc'!A0",
    "at formula": "@SUM(1+1)",
    "markdown link": "[click](javascript:alert(1))",
    "bare url": "see https://evil.example/x",
    "bare www": "or www.evil.example",
}
HOSTILE_IDS = list(HOSTILE)
HOSTILE_TEXTS = list(HOSTILE.values())
ENCODABLE_IDS = [name for name in HOSTILE if "surrogate" not in name]
ENCODABLE_TEXTS = [HOSTILE[name] for name in ENCODABLE_IDS]
"""What a suite's prompt file can name (its digest is taken over UTF-8)."""

TERMINAL_UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
"""What no line on a terminal may hold (tab allowed, newline checked per line)."""
SURROGATES = re.compile("[\ud800-\udfff]")


def assert_terminal_safe(text: str, newlines: bool = True) -> None:
    for line in text.split("\n") if newlines else [text]:
        assert not TERMINAL_UNSAFE.search(line), repr(line)
    assert not SURROGATES.search(text), repr(text)


def assert_bytes_terminal_safe(data: bytes) -> None:
    """What a process wrote: no C0 byte but tab and newline, no DEL, no C1 character."""
    assert all(b >= 0x20 or b in b"\n\t" for b in data if b != 0x7F) and 0x7F not in data, data
    assert_terminal_safe(data.decode("utf-8"))


# -- the sanitiser itself ------------------------------------------------------------
@pytest.mark.parametrize("hostile", HOSTILE_TEXTS, ids=HOSTILE_IDS)
def test_one_line_text_shows_every_control_as_an_escape(hostile: str) -> None:
    shown = visible(hostile + "\nsecond line")
    assert_terminal_safe(shown, newlines=False)
    assert "\n" not in shown and "\\n" in shown
    if TERMINAL_UNSAFE.search(hostile) or SURROGATES.search(hostile):
        assert "\\x" in shown or "\\u" in shown or "\\r" in shown


@pytest.mark.parametrize("hostile", HOSTILE_TEXTS, ids=HOSTILE_IDS)
def test_many_lines_keep_newlines_and_tabs_and_nothing_else(hostile: str) -> None:
    shown = terminal_text(f"one\t{hostile}\ntwo")
    assert_terminal_safe(shown)
    assert shown.startswith("one\t") and shown.endswith("\ntwo")


@pytest.mark.parametrize("hostile", HOSTILE_TEXTS, ids=HOSTILE_IDS)
def test_csv_cells_never_start_a_formula(hostile: str) -> None:
    cell = csv_cell(hostile)
    assert not cell.startswith(("=", "+", "-", "@", "\t", "\r"))
    assert_terminal_safe(cell)


@pytest.mark.parametrize("number", ["-0.25", "+1", "3", "1e-05", ".5"])
def test_numbers_written_as_text_stay_numbers_in_csv(number: str) -> None:
    assert csv_cell(number) == number


CONTROLS = st.characters(categories=("Cc", "Cf", "Cs", "Zl", "Zp"))
"""Control and format characters, lone surrogates, line and paragraph separators."""
TEXT = st.lists(
    st.one_of(st.characters(), CONTROLS, st.sampled_from(HOSTILE_TEXTS)), max_size=100
).map("".join)


@given(TEXT)
def test_any_text_comes_out_without_a_terminal_control(text: str) -> None:
    assert_terminal_safe(visible(text), newlines=False)
    assert_terminal_safe(terminal_text(text))
    assert visible(text).isprintable()
    terminal_text(text).encode("utf-8")  # a lone surrogate would fail here


@given(st.text(st.one_of(st.characters(max_codepoint=0x7E, exclude_characters="\\"), CONTROLS)))
def test_escapes_read_back_as_the_text(text: str) -> None:
    """The escapes are Python's own: a reader can tell exactly what the bytes were."""
    assert visible(text).encode("ascii").decode("unicode_escape") == text


@given(TEXT, st.integers(min_value=1, max_value=60))
def test_a_cut_line_is_bounded_and_never_ends_inside_an_escape(text: str, limit: int) -> None:
    shown = visible(text, limit)
    assert len(shown) <= limit
    if shown != visible(text):
        assert shown.endswith("…")
        assert not re.search(r"\\(x[0-9a-f]?|u[0-9a-f]{0,3})…$", shown), shown


# -- Markdown and CSV reports --------------------------------------------------------
def render_markdown(text: str) -> str:
    # HTML and bare-URL links on, as GitHub and most renderers have them
    return (
        MarkdownIt("commonmark", {"html": True, "linkify": True})
        .enable(["table", "linkify"])
        .render(text)
    )


@pytest.mark.parametrize("hostile", HOSTILE_TEXTS, ids=HOSTILE_IDS)
def test_markdown_cells_stay_text_with_html_on(hostile: str) -> None:
    table = md_table(["id", "note"], [[hostile, "x"], ["second", hostile]], markdown_cell)
    rendered = render_markdown("\n".join(table))
    assert "<script" not in rendered and "<a " not in rendered, "no HTML, no link"
    assert rendered.count("<tr>") == 3, rendered  # the header and two rows: no pipe broke one
    assert all(row.count("<td>") == 2 for row in rendered.split("<tr>")[2:]), rendered


def hostile_suite(hostile: str) -> dict:
    """A suite report's data whose prompt id, pair name, description and label, skipped
    prompt and session path are all `hostile`."""
    base = presets()["ubatch"]
    pair = replace(base, name=f"p{hostile}", description=hostile, a=replace(base.a, label=hostile))
    session = load_session(SESSION)
    record = record_from_session(session, pair.name, "", hostile, hostile, 0.5)
    settings = SuiteSettings(source=hostile, pairs=(pair,), max_tokens=60)
    outcome = SuiteOutcome(
        settings=settings,
        prompts=[SuitePrompt(id=hostile, prompt="The history of the Roman Empire")],
        ledger=Ledger.of([record]),
        executed={},
        skipped=[f"{hostile}: skipped"],
        cancelled=False,
        wall_seconds=1.0,
        resumed=0,
        started="2026-11-30T00:00:00+00:00",
    )
    return outcome_json(outcome)


@pytest.mark.parametrize("hostile", ENCODABLE_TEXTS, ids=ENCODABLE_IDS)
def test_a_suite_report_md_and_csv_hold_hostile_names_as_text(hostile: str) -> None:
    data = hostile_suite(hostile)
    report = markdown(data)
    rendered = render_markdown(report)
    assert "<script" not in rendered and "<a " not in rendered
    assert_terminal_safe(report)
    rows = list(csv.reader(io.StringIO(results_csv(data))))
    assert len(rows) == 2 and len(rows[1]) == len(rows[0])
    for cell in rows[1]:
        assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")), cell
        assert_terminal_safe(cell)


@pytest.mark.parametrize("hostile", ENCODABLE_TEXTS, ids=ENCODABLE_IDS)
def test_a_suite_report_html_holds_hostile_names_as_text(hostile: str) -> None:
    """`cat report.html` in a terminal: no name from a prompt file reaches it as a
    control character (html.escape alone kept ESC and BEL)."""
    page = html_report(hostile_suite(hostile))
    assert "<script" not in page.split("<body>", 1)[1]
    assert_terminal_safe(page)


# -- the terminal: the guard, the progress line, real processes ----------------------
@pytest.mark.parametrize("hostile", HOSTILE_TEXTS, ids=HOSTILE_IDS)
def test_the_output_guard_escapes_what_a_caller_forgot(hostile: str) -> None:
    sink = io.StringIO()
    guarded = GuardedStream(sink)
    print(f"lane text: {hostile}", file=guarded)  # type: ignore[arg-type]
    assert_terminal_safe(sink.getvalue())
    document = {"text": hostile, "n": [1, 2.5]}
    sink.seek(0), sink.truncate()
    json.dump(document, guarded, ensure_ascii=True)  # type: ignore[arg-type]
    assert json.loads(sink.getvalue()) == document, "ASCII JSON passes the guard unchanged"


def test_the_guard_is_lifted_when_the_command_ends() -> None:
    before = sys.stdout, sys.stderr
    with guarded_output():
        assert isinstance(sys.stdout, GuardedStream) and isinstance(sys.stderr, GuardedStream)
        with guarded_output():  # nested: one guard, not two escaping each other's escapes
            assert not isinstance(sys.stdout.unguarded, GuardedStream)  # type: ignore[attr-defined]
    assert (sys.stdout, sys.stderr) == before


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("hostile", HOSTILE_TEXTS, ids=HOSTILE_IDS)
def test_the_progress_line_rewrites_itself_but_shows_quoted_text(hostile: str) -> None:
    terminal = Terminal()
    status = Status(GuardedStream(terminal), enabled=True)  # type: ignore[arg-type]
    status.update(f"generating {hostile}")
    status.message(f"server said {hostile}")
    status.done()
    written = terminal.getvalue()
    assert written.startswith("\rgenerating ")  # its own carriage return still rewrites
    assert_terminal_safe(written.replace("\r", ""))


def specdiff(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "specdiff", *args],
        capture_output=True,
        timeout=120,
        cwd=cwd,
    )


def hostile_session(path: Path, hostile: str, pieces: list[str] | None = None) -> Path:
    """The recorded session with `hostile` in its pair, description and prompt, and
    each of `pieces` in turn (default: `hostile`) as its tokens."""
    records = [json.loads(line) for line in SESSION.read_text(encoding="utf-8").splitlines()]
    records[0].update(pair=f"p{hostile}", prompt=f"prompt {hostile}", description=hostile)
    steps = [record for record in records if record["type"] == "step"]
    for number, record in enumerate(steps):
        record["piece"] = f"{(pieces or [hostile])[number % len(pieces or [hostile])]}\n"
        record["top"][0][2] = record["piece"]
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_sessions_listing_and_its_json_hold_no_control_character(tmp_path: Path) -> None:
    """One process lists a session per hostile string, and files whose names hold them."""
    for number, hostile in enumerate(HOSTILE_TEXTS):
        hostile_session(tmp_path / f"shared-{number}.jsonl", hostile)
        name = f"bad-{number}{hostile}.jsonl".replace("/", "_").replace("\x00", "0")
        (tmp_path / name).write_bytes(b"not json\n")
    for arguments in ([], ["--json"]):
        done = specdiff("sessions", "--sessions-dir", str(tmp_path), *arguments)
        assert done.returncode == 0, done.stderr
        assert_bytes_terminal_safe(done.stdout)
        assert_bytes_terminal_safe(done.stderr)
        lines = done.stdout.decode().splitlines()
        assert sum("unreadable" in line or '"problem": "' in line for line in lines) == len(HOSTILE)
    listed = specdiff("sessions", "--sessions-dir", str(tmp_path), "--json").stdout.splitlines()
    prompts = {json.loads(line)["prompt"] for line in listed}
    assert {f"prompt {hostile}" for hostile in HOSTILE_TEXTS} <= prompts, "JSON keeps the text"


def pairs_file(path: Path, hostile: str) -> Path:
    escaped = json.dumps(hostile)  # a TOML basic string takes JSON's escapes
    path.write_text(
        f'[pairs.{json.dumps("p" + hostile)}]\nfrom = "ubatch"\ndescription = {escaped}\n'
        f"a = {{ label = {escaped} }}\n",
        encoding="utf-8",
    )
    return path


EVERY_HOSTILE = "".join(HOSTILE_TEXTS)
EVERY_ENCODABLE = "".join(ENCODABLE_TEXTS)
"""What a TOML file can hold: no lone surrogate."""
IN_ARGUMENTS = EVERY_HOSTILE.replace("\x00", "")  # no command line can hold a NUL
ERROR_CASES = {
    "unknown pair": ["run", "--pair", f"unknown{IN_ARGUMENTS}"],
    "pair not in the pairs file": ["run", "--pairs", "{pairs}", "--pair", "missing"],
    "bad value in the pairs file": ["run", "--pairs", "{bad}", "--pair", "p"],
    "missing prompt file": ["run", "--prompt-file", f"none{IN_ARGUMENTS.replace('/', '_')}"],
}


@pytest.mark.parametrize("arguments", list(ERROR_CASES.values()), ids=list(ERROR_CASES))
def test_error_lines_about_hostile_names_are_one_safe_line(tmp_path, arguments) -> None:
    pairs = pairs_file(tmp_path / "pairs.toml", EVERY_ENCODABLE)
    bad = tmp_path / "bad.toml"
    bad.write_text(f'[pairs.p]\nfrom = "ubatch"\na = {{ n_ctx = {json.dumps(EVERY_ENCODABLE)} }}\n')
    done = specdiff(*(a.format(pairs=pairs, bad=bad) for a in arguments))
    assert done.returncode == 2, done.stderr
    assert_bytes_terminal_safe(done.stderr)
    assert len(done.stderr.decode().strip().splitlines()) == 1, done.stderr
    assert b"\\x1b]52;c;" in done.stderr, "the escape sequence is shown, not dropped"


@pytest.mark.model
@pytest.mark.parametrize("hostile", [HOSTILE["osc52 clipboard"], HOSTILE["c1 csi"]])
def test_run_prints_a_hostile_pairs_file_as_text(tmp_path: Path, hostile: str) -> None:
    pairs = pairs_file(tmp_path / "pairs.toml", hostile)
    done = specdiff(
        "run", "--pairs", str(pairs), "--pair", "p" + hostile, "--max-tokens", "2",
        "--prompt", f"Say {hostile}",
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    assert_bytes_terminal_safe(done.stdout)
    assert_bytes_terminal_safe(done.stderr)
    assert visible("p" + hostile) in done.stdout.decode()


@pytest.mark.model
def test_verify_prints_a_hostile_recorded_build_as_text(tmp_path: Path) -> None:
    """The build, CPU and system info a shared session claims, and its file name."""
    attack = HOSTILE["osc52 clipboard"] + HOSTILE["c1 csi"] + HOSTILE["bidi override"]
    records = [json.loads(line) for line in SESSION.read_text(encoding="utf-8").splitlines()]
    build = records[0]["build"]
    build.update(cpu=f"cpu{attack}", llama_cpp_build=f"b{attack}")
    build["system_info"] += f" AVX512{attack} = 1 |"
    path = tmp_path / f"shared{attack}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    done = specdiff("verify", str(path))
    assert done.returncode in (0, 1), done.stderr
    assert_bytes_terminal_safe(done.stdout)
    assert_bytes_terminal_safe(done.stderr)
    assert b"\\x1b]52;c;" in done.stdout, "the recorded build is shown, escaped"


# -- the TUI ---------------------------------------------------------------------------
async def test_a_hostile_replay_renders_escapes_and_no_control(tmp_path: Path) -> None:
    """Every hostile string as a token, and all of them in the pair name and prompt."""
    path = hostile_session(tmp_path / "shared.jsonl", EVERY_HOSTILE, HOSTILE_TEXTS)
    session = load_session(path)
    pairs = {**presets(), session.pair.name: session.pair}
    app = make_app(pairs, session.pair.name, session.prompt, 60, session=session)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        app.notify(f"note {EVERY_HOSTILE}")
        await pilot.pause()
        lines = rendered_lines(app)
        for line in lines:
            assert_terminal_safe(line, newlines=False)
        for hostile in HOSTILE_TEXTS[:3]:  # the first tokens, on screen at 100x30
            assert any(visible(hostile) in line for line in lines), hostile
        for view in app.query(TokenView):
            # the pane's own lines, before the screen's last guard
            for y in range(view.size.height):
                text = "".join(segment.text for segment in view.render_line(y))
                assert_terminal_safe(text, newlines=False)
        # the prompt box shows the escapes; an unedited box still runs the recorded prompt
        assert drive(app).resolve_pair()[1] == session.prompt
        # the last guard: text a widget forgot to escape loses its controls when drawn
        await app.mount(Static(Text(f"raw {EVERY_HOSTILE}"), id="raw"))
        await pilot.pause()
        drawn = [line for line in rendered_lines(app) if "raw " in line]
        assert drawn and all(not TERMINAL_UNSAFE.search(line) for line in drawn), drawn


@pytest.mark.parametrize(
    "text",
    [
        "".join(chr(code) for code in range(0x20)) + "\x7f plain ünïcode",
        "c1 \x85\x9b, separators \u2028\u2029, bidi \u202e\u2066\u200f\u061c",
        "pictures typed as text: ␤ ␉ ␛ ␊ ␡",
        "東京\u3000大阪, a no-break\u00a0space, a family 👨\u200d👩\u200d👧",
        'code keeps its backslashes: print("a\\nb"), C:\\new\\x1b',
    ],
)
def test_one_line_text_reads_back_as_the_text(text: str) -> None:
    """What a one-line input shows reads back exactly, nothing unsafe is shown raw, and
    characters a terminal shows safely (a full-width space, a joiner) are not escaped."""
    from specdiff.safe_text import from_one_line, on_one_line

    shown = on_one_line(text)
    assert from_one_line(shown) == text
    assert "\n" not in shown
    assert_terminal_safe(shown, newlines=False)
    assert "\u3000" in on_one_line("\u3000") and "\u200d" in on_one_line("\u200d")
