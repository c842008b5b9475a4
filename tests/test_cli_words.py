"""What a person reads on the command line: the fork explained in probabilities first,
the glossary behind its words, text fitted to the terminal and coloured only there,
progress bars that never wrap, names that suggest the nearest known one, and the
suite report's tables in a laptop's browser.

Pure: recorded demo sessions and steps built here; the terminal is a real pty."""

from __future__ import annotations

import dataclasses
import fcntl
import io
import math
import os
import re
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from specdiff.cli import main
from specdiff.cli.common import Status, bar_line, wants_colour, with_suggestion
from specdiff.compare import DEFAULT_NEAR_TIE, NEAR_TIE, fork_between, fork_verdict
from specdiff.errors import did_you_mean
from specdiff.fork_words import fork_explanation, percent
from specdiff.glossary import GLOSSARY, terms_footer, terms_in
from specdiff.lanes import presets, unknown_pair
from specdiff.reports.styles import PLAIN, RESET, SEQUENCES, SGR, Paint
from specdiff.reports.suite import html_report, markdown, prompt_label, summary_table
from specdiff.reports.svg import histogram, whole_ticks
from specdiff.reports.text import Layout, format_result, result_json
from specdiff.safe_text import styled_terminal_text
from specdiff.steps import Candidate, TokenStep
from tests.test_suite_stats import Run, suite_data
from tests.test_verdict import DEMOS, result_of

ROOT = Path(__file__).resolve().parent.parent
SGR_PATTERN = re.compile(r"\x1b\[[0-9;]*m")
PIECES = {1: b" that", 2: b",", 9: b" far"}


def step(lane: str, token: int, logits: dict[int, float], logsumexp: float | None = None):
    top = tuple(
        Candidate(t, v, PIECES.get(t, b"?"))
        for t, v in sorted(logits.items(), key=lambda item: (-item[1], item[0]))
    )
    return TokenStep(lane, 0, token, PIECES[token], top, False, 1, 0.0, logsumexp=logsumexp)


def normalizer_for(logit: float, probability: float) -> float:
    """The logsumexp that gives `logit` this probability."""
    return logit - math.log(probability)


# -- the explanation -----------------------------------------------------------------
def test_a_near_tie_leads_with_both_probabilities_then_gives_the_logits() -> None:
    """The newcomer's sentence: 39% against 37%, nearly 50/50, and how far lane b's
    arithmetic moved the scores, in logits; the exact numbers follow on their own."""
    total = normalizer_for(10.0, 0.393)
    a = step("a", 1, {1: 10.0, 2: 9.94}, total)
    b = step("b", 2, {2: 9.87, 1: 9.79}, total)
    fork = fork_between(0, a, b)
    explanation = fork_explanation(fork, fork_verdict(a, b))
    assert explanation.label == "near tie flipped"
    assert explanation.plain.startswith(
        "lane a was nearly 50/50 between ' that' (39%) and ',' (37%); "
    )
    assert "lane b's arithmetic moved the scores by 0.14 logits, enough to swap them" in (
        explanation.plain
    )
    assert explanation.detail is not None
    assert "were 0.06 apart in lane a; lane b moved them by -0.21 and -0.07" in explanation.detail
    assert explanation.sentence == (
        f"near tie flipped: {explanation.plain}; in logits: {explanation.detail}"
    )


def test_two_unlikely_candidates_are_not_called_50_50() -> None:
    """12% against 10%: nothing told them apart, but most of the probability was on
    other tokens, so 'nearly 50/50' would mislead."""
    total = normalizer_for(10.0, 0.12)
    a = step("a", 1, {1: 10.0, 2: 9.82}, total)
    b = step("b", 2, {2: 9.9, 1: 9.85}, total)
    explanation = fork_explanation(fork_between(0, a, b), fork_verdict(a, b))
    assert explanation.plain.startswith(
        "lane a could hardly tell apart ' that' (12%) and ',' (10%)"
    )
    assert "50/50" not in explanation.plain


def test_without_a_normalizer_the_odds_stand_in_for_probabilities() -> None:
    a, b = step("a", 1, {1: 10.0, 2: 9.9}), step("b", 2, {2: 9.98, 1: 9.95})
    explanation = fork_explanation(fork_between(0, a, b), fork_verdict(a, b))
    assert explanation.plain.startswith("lane a held ' that' only 1.11 times as likely as ','")
    assert "%" not in explanation.plain


def test_a_large_margin_split_says_how_sure_the_reference_was() -> None:
    total = normalizer_for(10.0, 0.9)
    a = step("a", 1, {1: 10.0, 9: 7.0, 2: 5.0}, total)
    b = step("b", 2, {2: 9.98, 1: 9.95})
    explanation = fork_explanation(fork_between(0, a, b), fork_verdict(a, b))
    assert explanation.plain.startswith("lane a gave ' that' 90% and ',' only 0.6%")
    assert "lane b changed the computation" in explanation.plain
    assert explanation.detail is not None and "5.00 below lane a's best" in explanation.detail


@pytest.mark.parametrize(
    ("probability", "shown"),
    [(0.393, "39%"), (0.0061, "0.6%"), (0.0004, "<0.1%"), (0.9971, "99.7%"), (1.0, "100%")],
)
def test_percentages_read_as_people_say_them(probability: float, shown: str) -> None:
    assert percent(probability) == shown


# -- the glossary --------------------------------------------------------------------
WANTED = (
    "logit",
    "margin",
    "near tie",
    "fork",
    "fork class",
    "acceptance",
    "noise floor",
    "forecast",
    "lane",
    "pair",
)


def test_the_glossary_holds_every_term_in_one_or_two_sentences() -> None:
    assert tuple(term.name for term in GLOSSARY) == WANTED
    for term in GLOSSARY:
        sentences = [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z])", term.definition) if s]
        assert 1 <= len(sentences) <= 2, term.name
        assert len(term.short) < 70, term.name


def test_the_docs_page_says_what_the_module_says() -> None:
    page = (ROOT / "docs" / "glossary.md").read_text(encoding="utf-8")
    for term in GLOSSARY:
        assert f"## {term.name}\n{term.definition}\n" in page, term.name


def test_the_footer_defines_only_the_terms_the_text_used() -> None:
    text = "DIVERGED at token 4. near ties before the fork (margin < 0.5): lane a 2"
    names = ("logit", "margin", "near tie", "acceptance")
    assert [term.name for term in terms_in(text, names)] == ["margin", "near tie"]
    footer = terms_footer(text, names, 60)
    assert footer[0].startswith("terms (all of them: specdiff run --help)")
    assert len(footer) == 3 and all(len(line) <= 60 for line in footer)
    assert terms_footer("no words of it here", names) == []
    assert terms_in("nearby tiers", ("near tie",)) == []


def test_run_help_prints_the_glossary(capsys) -> None:
    with pytest.raises(SystemExit) as done:
        main(["run", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "NO_COLOR" in out
    for term in GLOSSARY:
        assert f"\n{term.name}\n  " in out


# -- the run's text: width, colour, caps -----------------------------------------------
@pytest.mark.parametrize("path", DEMOS, ids=lambda p: p.name.split("-", 1)[1])
def test_a_terminal_layout_fits_80_columns_and_colours_the_verdict(path: Path) -> None:
    result = result_of(path)
    text = format_result(result, Layout(width=80, paint=Paint(True), wrap_sentences=True))
    plain = SGR_PATTERN.sub("", text).splitlines()
    assert [line for line in plain if len(line) >= 80] == []
    assert f"{SGR['bad']}DIVERGED{RESET} at token" in text
    fork = result.comparison.fork
    assert fork is not None
    assert f"{SGR['fork']}{fork.piece_a.decode()!r}{RESET}" in text
    why = plain.index(next(line for line in plain if line.startswith("why: ")))
    assert plain[why + 1].startswith("     ") and "in logits: " in "".join(plain[why : why + 6])
    assert set(SGR_PATTERN.findall(text)) <= set(SEQUENCES)


@pytest.mark.parametrize("path", DEMOS, ids=lambda p: p.name.split("-", 1)[1])
def test_the_continuation_is_capped_and_counts_what_it_left_out(path: Path) -> None:
    result = result_of(path)
    lines = format_result(result, Layout(shown_lines=3)).splitlines()
    start = lines.index(next(line for line in lines if line.startswith("lane a continues")))
    # 200 recorded tokens are many more than 3 lines: three shown, the fourth counts the rest
    shown = [line for line in lines[start + 1 : start + 6] if line.startswith("    ")]
    assert len(shown) == 4
    left = re.fullmatch(r"    … (\d+) more lines? \(the whole text: .*\)", shown[3])
    assert left is not None
    full = format_result(result, Layout(shown_lines=10_000)).splitlines()
    assert len(full) > len(lines) and "more line" not in "\n".join(full)


def test_a_long_continuation_is_cut_and_the_cut_is_counted() -> None:
    result = result_of(DEMOS[0])
    fork = result.comparison.fork
    assert fork is not None
    long_steps = list(result.a.steps) + [
        dataclasses.replace(result.a.steps[-1], index=n, piece=b" word" * 12)
        for n in range(len(result.a.steps), len(result.a.steps) + 40)
    ]
    longer = dataclasses.replace(result, a=dataclasses.replace(result.a, steps=long_steps))
    lines = format_result(longer, Layout(width=60)).splitlines()
    start = lines.index(next(line for line in lines if line.startswith("lane a continues")))
    body = lines[start + 1 : start + 14]
    assert all(line.startswith("    ") for line in body)
    assert re.match(r"    … \d+ more lines \(the whole text", body[12])


@pytest.mark.parametrize("path", DEMOS, ids=lambda p: p.name.split("-", 1)[1])
def test_piped_text_has_no_control_sequence(path: Path) -> None:
    text = format_result(result_of(path))
    assert "\x1b" not in text
    assert "\nterms (all of them: specdiff run --help):\n" in text


def test_the_threads_pair_names_each_lanes_thread_count() -> None:
    result = result_of(DEMOS[0])
    threads = presets()["threads"]
    relabelled = dataclasses.replace(
        result,
        pair=threads,
        a=dataclasses.replace(result.a, lane=threads.a),
        b=dataclasses.replace(result.b, lane=threads.b),
    )
    lines = format_result(relabelled).splitlines()
    assert any(line.startswith("lane a  threads 1 ") for line in lines)
    assert any(line.startswith("lane b  threads 2 ") for line in lines)


def test_the_json_gives_the_explanation_in_parts() -> None:
    data = result_json(result_of(DEMOS[0]))
    parts = data["explanation"]
    # the verdict stays the short line of numbers it was; the plain words sit beside it
    assert parts["detail"] is not None and parts["plain"] not in data["verdict"]
    assert data["verdict"] == f"{parts['label']}: {parts['detail']}"


def test_styled_text_keeps_its_own_colours_and_escapes_any_other_control() -> None:
    painted = Paint(True)("bad", "DIVERGED")
    hostile = "\x1b]52;c;aGk=\x07 \x1b[31mred\x1b[2J \x9b1m"
    shown = styled_terminal_text(painted + " " + hostile, SEQUENCES)
    assert shown.startswith(f"{SGR['bad']}DIVERGED{RESET} ")
    assert "\\x1b]52" in shown and "\\x1b[31m" in shown and "\\x1b[2J" in shown
    assert "\\x9b" in shown and "\x07" not in shown
    assert shown.count("\x1b") == 2
    assert PLAIN("bad", "DIVERGED") == "DIVERGED"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("environment", "terminal", "expected"),
    [
        ({}, True, True),
        ({}, False, False),
        ({"NO_COLOR": "1"}, True, False),
        ({"NO_COLOR": "1", "FORCE_COLOR": "1"}, True, False),
        ({"FORCE_COLOR": "1"}, False, True),
        ({"FORCE_COLOR": "0"}, False, False),
        ({"TERM": "dumb"}, True, False),
    ],
)
def test_colour_only_where_a_terminal_wants_it(
    monkeypatch, environment, terminal, expected
) -> None:
    for name in ("NO_COLOR", "FORCE_COLOR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    stream = Terminal() if terminal else io.StringIO()
    assert wants_colour(stream) is expected


# -- progress bars -------------------------------------------------------------------
def pty_of_width(columns: int) -> tuple[int, io.TextIOWrapper]:
    """A real terminal `columns` wide: its reading end, and a text stream writing to it."""
    reader, writer = os.openpty()
    fcntl.ioctl(writer, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    return reader, io.TextIOWrapper(os.fdopen(writer, "wb"), encoding="utf-8", write_through=True)


def read_all(reader: int) -> str:
    """Everything written to the terminal so far."""
    chunks = []
    while select.select([reader], [], [], 0.2)[0]:
        chunks.append(os.read(reader, 65536))
    return b"".join(chunks).decode("utf-8")


@pytest.mark.parametrize("columns", [40, 80, 200])
def test_a_progress_bar_never_wraps_in_a_terminal(columns: int) -> None:
    reader, stream = pty_of_width(columns)
    figures = "12/164 (7%) · 3 in flight · 0.52 prompts/s · 180 tokens/s · ETA 4m05s · ubatch p"
    try:
        # two commands' bars, each its first redraw (a redraw comes at most every 0.1 s)
        for fraction, shown in ((0.5, figures + "rompt-with-a-long-name"), (0.75, figures)):
            status = Status(stream, enabled=True)
            status.bar(fraction, shown)
            status.done()
        written = read_all(reader)
    finally:
        stream.close()
        os.close(reader)
    drawn = [part for part in written.split("\r") if part.strip()]
    assert len(drawn) == 2 and all(part.startswith("[") for part in drawn)
    assert all(len(part.rstrip()) <= columns - 1 for part in drawn)
    assert "\n" not in written
    # where the figures did not fit, the bar shrank to 8 cells first, then the line was cut
    assert [part.rstrip().endswith("…") for part in drawn] == [columns < 130, columns < 100]
    assert drawn[0].startswith("[" + "█" * 4 + "░" * 4 + "]") == (columns < 130)


def test_a_progress_bar_is_not_redrawn_off_a_terminal() -> None:
    log = io.StringIO()
    status = Status(log, enabled=True)
    status.bar(0.5, "1/2 runs")
    status.update("generating")
    status.done()
    assert log.getvalue() == ""


def test_a_bar_shrinks_before_its_figures_are_cut() -> None:
    assert bar_line(0.5, "3/4 runs", None) == f"[{'█' * 12}{'░' * 12}] 3/4 runs"
    narrow = bar_line(0.5, "x" * 40, 60)
    assert narrow.startswith("[") and narrow.endswith("x") and len(narrow) <= 59
    assert bar_line(1.0, "y" * 200, 50).endswith("…") and len(bar_line(1.0, "y" * 200, 50)) == 49


# -- did you mean --------------------------------------------------------------------
def test_an_unknown_pair_names_the_nearest() -> None:
    message = str(unknown_pair("ubatc", presets()))
    assert message.startswith("unknown pair 'ubatc'; did you mean 'ubatch'? known pairs: ")
    assert "did you mean" not in str(unknown_pair("zzzz", presets()))
    assert did_you_mean("SPEC-VS-PLAIN", ["spec-vs-plain"]) == "did you mean 'spec-vs-plain'? "


def test_run_with_a_mistyped_pair_is_one_line_with_a_suggestion(capsys) -> None:
    assert main(["run", "--pair", "ubatc", "--prompt", "hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "did you mean 'ubatch'?" in err


def test_a_mistyped_command_names_the_nearest(capsys) -> None:
    assert main(["suit"]) == 2
    assert "did you mean 'suite'?" in capsys.readouterr().err
    assert with_suggestion("argument --x: invalid choice: 'q' (choose from 'a', 'b')").endswith(
        "(choose from 'a', 'b')"
    )


def test_other_unknown_names_suggest_too(tmp_path: Path, monkeypatch) -> None:
    from specdiff.reports.export import ExportError, report_format
    from specdiff.suite import SuiteError
    from specdiff.suite.prompts import load_suite_prompts
    from specdiff.suite.settings import check_quants

    with pytest.raises(ExportError, match="did you mean 'html'"):
        report_format("htm", None)
    with pytest.raises(SuiteError, match="did you mean 'humaneval'"):
        monkeypatch.chdir(tmp_path)  # no file of that name here
        load_suite_prompts("humaneva")
    with pytest.raises(SuiteError, match="did you mean 'q8_0'"):
        check_quants(["q8_O"])


def test_replay_help_says_what_speed_does(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["replay", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "4 plays four times faster, 0.25 four times slower; 0.01 or more (default 1)" in out
    assert main(["replay", str(DEMOS[0]), "--speed", "0.005"]) == 2


# -- the suite report ----------------------------------------------------------------
def test_the_summary_leaves_out_columns_no_pair_fills() -> None:
    data = suite_data([Run(True, None), Run(False, None, NEAR_TIE)])
    header, rows = summary_table(data)
    assert "draft acceptance a / b" not in header and "McNemar p" not in header
    assert "solved a / b" not in header and "concurrency" not in header
    assert header[:3] == ["pair", "identical", "forked"] and len(header) <= 11
    assert all(len(row) == len(header) for row in rows)
    graded = summary_table(suite_data([Run(True, (True, True)), Run(False, (True, False))]))[0]
    assert "solved a / b" in graded and "McNemar p" in graded


def test_prompts_are_named_by_their_text_escaped() -> None:
    data = suite_data([Run(True, None)], ids=["p<1>"])
    data["prompt_texts"] = {"p<1>": "Write <script>alert(1)</script>\x1b[2J and " + "word " * 40}
    label = prompt_label(data, "p<1>")
    assert label.startswith("p<1>: Write <script>") and label.endswith("…") and len(label) < 90
    assert "\x1b" not in label
    page = html_report(data)
    assert "<script>alert" not in page and "p&lt;1&gt;: Write &lt;script&gt;" in page
    assert "p\\<1\\>: Write" not in markdown(data)  # the id and its text in one escaped cell
    assert "p&lt;1&gt;: Write &lt;script&gt;" in markdown(data)
    assert prompt_label({"prompt_texts": {}}, "q7") == "q7"


def test_the_report_keeps_each_prompts_text() -> None:
    data = suite_data([Run(True, None)], ids=["p0"])
    assert data["prompt_texts"] == {"p0": "def f():"}


def test_configuration_is_folded_and_devices_read_as_words() -> None:
    data = suite_data([Run(False, None, NEAR_TIE)])
    devices = [{"name": "CPU", "description": "AMD EPYC 7B13", "type": "cpu", "memory_free": 1}]
    data["pairs"][0]["configuration"] = {
        "lanes": {"a": {"n_ubatch": 512}, "b": {"n_ubatch": 2}},
        "executed": {"a": {"devices": devices}, "b": {"devices": devices}},
    }
    page = html_report(data)
    assert "<details><summary>Configuration, 2 settings: the lanes differ in n_ubatch" in page
    assert "AMD EPYC 7B13 (cpu)" in page and "{&#x27;name&#x27;" not in page
    assert "'name'" not in page
    assert page.index("<h2>Prompts</h2>") > page.index("</details>")


def test_a_histogram_of_counts_ticks_whole_numbers() -> None:
    assert whole_ticks(1.0) == [0.0, 1.0]
    assert whole_ticks(2.0) == [0.0, 1.0, 2.0]
    assert whole_ticks(40.0) == [0.0, 10.0, 20.0, 30.0, 40.0]
    svg = histogram([1, 2, 0], ["0–9", "10–19", "20–29"], title="t", x_label="x")
    labels = re.findall(r">([0-9.]+)</text>", svg)
    assert labels and all("." not in label for label in labels)


def test_the_near_tie_default_is_the_glossarys() -> None:
    assert (
        f"under {DEFAULT_NEAR_TIE:g} logit"
        in next(t for t in GLOSSARY if t.name == "near tie").short
    )


@pytest.mark.model
def test_run_colours_its_verdict_into_a_pipe_only_when_forced() -> None:
    """FORCE_COLOR=1: the verdict word in bold red or green, and no other control
    sequence than specdiff's own; the footer defines the terms the text used."""
    environment = {k: v for k, v in os.environ.items() if k != "NO_COLOR"} | {"FORCE_COLOR": "1"}
    completed = subprocess.run(
        [sys.executable, "-m", "specdiff", "run", "--max-tokens", "6", "--quiet"],
        capture_output=True,
        text=True,
        timeout=300,
        env=environment,
    )
    assert completed.returncode in (0, 1), completed.stderr
    out = completed.stdout
    verdicts = re.findall(r"\x1b\[1;3([12])m(IDENTICAL|DIVERGED)\x1b\[0m", out)
    assert verdicts in ([("2", "IDENTICAL")], [("1", "DIVERGED")])
    assert set(SGR_PATTERN.findall(out)) <= set(SEQUENCES)
    assert "\x1b" not in SGR_PATTERN.sub("", out)
    assert "\nterms (all of them: specdiff run --help):\n" in out


@pytest.mark.parametrize(
    "command",
    [
        ["explain", "--svg", "/nonexistent-folder/growth.svg"],
        ["certify", "--html", "/nonexistent-folder/certificate.html"],
    ],
)
def test_an_endpoint_on_an_in_process_lane_is_named_as_unread(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # the note comes before the output file is checked, whose refusal ends the command
    code = main([*command, "--lane-a", "endpoint=http://127.0.0.1:9", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "/nonexistent-folder" in err
    notes = [line for line in err.splitlines() if line.startswith("specdiff: note:")]
    assert notes == [
        "specdiff: note: lane a runs in-process, where endpoint is not read "
        "(server lanes only: backend=server)"
    ]
