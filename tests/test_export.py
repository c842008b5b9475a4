"""`specdiff export` and its charts, on the recorded demo sessions (no model needed)."""

from __future__ import annotations

import base64
import contextlib
import json
import math
import os
import pty
import re
import select
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest

from specdiff import files as files_module
from specdiff.cli import main
from specdiff.compare import DEFAULT_NEAR_TIE
from specdiff.fork_words import run_fork_account
from specdiff.reports.export import ExportError, export_session, token_texts, write_report
from specdiff.reports.svg import (
    HEIGHT,
    MAX_POINTS,
    SVG_NAMESPACE,
    TOP,
    Series,
    histogram,
    line_chart,
    margin_plot,
    xml_text,
)
from specdiff.sessions.store import load_session
from specdiff.steps import text_of

ROOT = Path(__file__).resolve().parent.parent
DEMOS = sorted((ROOT / "sessions").glob("*.jsonl"))
UBATCH = next(path for path in DEMOS if "ubatch" in path.name)
SVG = f"{{{SVG_NAMESPACE}}}"
SCRIPT = "<script>alert(1)</script>"


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def write_records(path: Path, lines: list[dict]) -> Path:
    path.write_text(
        "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines), encoding="utf-8"
    )
    return path


def edited(tmp_path: Path, edit: Callable[[list[dict]], None], name: str = "edited") -> Path:
    """A copy of the ubatch demo (fork at 11) with its records changed in place."""
    lines = records(UBATCH)
    edit(lines)
    return write_records(tmp_path / f"{name}.jsonl", lines)


def step_of(lines: list[dict], lane: str, index: int) -> dict:
    return next(
        line
        for line in lines
        if line["type"] == "step" and line["lane"] == lane and line["index"] == index
    )


def partial_copy(tmp_path: Path, steps_per_lane: int, name: str = "partial") -> Path:
    """The demo as a killed run leaves it: no footer, only the first steps."""
    lines = records(UBATCH)
    kept = [lines[0], *lines[1 : 1 + 2 * steps_per_lane]]
    assert all(line["type"] != "footer" for line in kept)
    return write_records(tmp_path / f"{name}.jsonl.partial", kept)


def with_script(lines: list[dict]) -> None:
    """Model text that would run as a script if a report pasted it in unescaped."""
    for lane in ("a", "b"):
        step_of(lines, lane, 3)["piece"] = SCRIPT
    fork_step = step_of(lines, "a", 11)
    fork_step["piece"] = SCRIPT
    fork_step["top"][0][2] = SCRIPT
    lines[0]["description"] = f"pair {SCRIPT} & more"


def run_cli(arguments: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(arguments)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


class BalanceChecker(HTMLParser):
    """Every element closed in order: what a browser would otherwise repair silently."""

    VOID = {"meta", "br", "hr", "img", "input", "link", "wbr", "col", "area", "base", "source"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.problems: list[str] = []
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            return
        self.stack.pop()


def check_html(html: str) -> BalanceChecker:
    checker = BalanceChecker()
    checker.feed(html)
    checker.close()
    assert not checker.problems, checker.problems[:5]
    assert not checker.stack, checker.stack
    return checker


def svgs_in(text: str) -> list[ET.Element]:
    return [ET.fromstring(match) for match in re.findall(r"<svg\b.*?</svg>", text, re.DOTALL)]


def outside_code(markdown: str) -> str:
    """Markdown with fenced blocks and inline code spans removed: what renders as markup."""
    without_blocks = re.sub(r"^(`{3,})[^\n]*\n.*?^\1$", "", markdown, flags=re.DOTALL | re.M)
    return re.sub(r"(`+).+?\1", "", without_blocks)


# --- the three formats ------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["md", "html", "json"])
def test_each_format_through_the_cli_writes_one_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    output = tmp_path / f"report.{fmt}"
    code, out, err = run_cli(["export", str(UBATCH), "-o", str(output)], capsys)
    assert code == 0
    assert out == ""
    assert str(output) in err
    assert [path.name for path in tmp_path.iterdir()] == [output.name]
    assert output.read_text(encoding="utf-8") == export_session(load_session(UBATCH), fmt)


def test_stdout_is_the_default_and_markdown_the_default_format(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run_cli(["export", str(UBATCH)], capsys)
    assert code == 0
    assert err == ""
    assert out == export_session(load_session(UBATCH), "md")
    code, out, _ = run_cli(["export", str(UBATCH), "--format", "json", "-o", "-"], capsys)
    assert code == 0
    assert json.loads(out)["pair"] == "ubatch"


@pytest.mark.parametrize(
    ("name", "start"),
    [("r.html", "<!DOCTYPE html>"), ("r.HTM", "<!DOCTYPE html>"), ("r.json", "{"), ("r.txt", "#")],
)
def test_format_follows_the_output_suffix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, start: str
) -> None:
    output = tmp_path / name
    assert run_cli(["export", str(UBATCH), "-o", str(output)], capsys)[0] == 0
    assert output.read_text(encoding="utf-8").startswith(start)


def test_an_explicit_format_wins_over_the_suffix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "report.html"
    assert run_cli(["export", str(UBATCH), "--format", "json", "-o", str(output)], capsys)[0] == 0
    json.loads(output.read_text(encoding="utf-8"))


@pytest.mark.parametrize("path", DEMOS, ids=lambda p: p.name.split("-", 1)[1])
def test_markdown_has_the_verdict_the_fork_token_and_the_plot(path: Path) -> None:
    session = load_session(path)
    comparison = session.comparison()
    fork = comparison.fork
    assert fork is not None, "the demo sessions fork"
    markdown = export_session(session, "md")
    length = max(comparison.length_a, comparison.length_b)
    assert f"forked at token {fork.index} of {length}" in markdown
    assert f"⟦{fork.piece_a.decode()}⟧" in markdown
    assert f"⟦{fork.piece_b.decode()}⟧" in markdown
    assert f"{fork.a.margin:.3f}" in markdown and f"{fork.b.margin:.3f}" in markdown
    assert "complete" in markdown.splitlines()[0]
    # the whole configuration: every lane key, both models' hashes, the build
    for key in session.header.pair.a.as_dict():
        assert key.replace("_", "\\_") in markdown
    assert session.header.executed["a"]["model_sha256"] in markdown
    assert session.header.build["llama_cpp_build"] in markdown
    for digest in session.footer.output_sha256:
        assert digest in markdown
    encoded = re.search(r"\(data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)\)", markdown)
    assert encoded is not None
    plot = ET.fromstring(base64.b64decode(encoded.group(1)))
    assert plot.tag == f"{SVG}svg"
    assert "<svg" not in markdown, "the plot travels as a data URI, not raw markup"


@pytest.mark.parametrize("path", DEMOS, ids=lambda p: p.name.split("-", 1)[1])
def test_html_is_one_well_formed_self_contained_page(path: Path) -> None:
    session = load_session(path)
    fork = session.comparison().fork
    html = export_session(session, "html")
    checker = check_html(html)
    assert html.startswith("<!DOCTYPE html>")
    assert '<meta charset="utf-8">' in html
    assert "prefers-color-scheme: dark" in html
    assert "<script" not in html.lower()
    assert "<svg" in html and "<mark" in html
    external = re.findall(r"https?://[^\s\"'<>)]*", html)
    assert set(external) <= {SVG_NAMESPACE}, external
    assert not [tag for tag, attrs in checker.tags if tag == "link" or "src" in attrs]
    plots = svgs_in(html)
    assert len(plots) == 1
    assert plots[0].find(f"{SVG}title") is not None
    marks = [attrs for tag, attrs in checker.tags if tag == "mark" and attrs.get("id")]
    assert {attrs["id"] for attrs in marks} == {"fork-a", "fork-b"}
    assert all(f"margin {fork.a.margin:.3f}" in (attrs["title"] or "") for attrs in marks[:1])
    assert 'class="changed"' in html, "the texts differ after the fork"


def test_model_text_cannot_inject_markup(tmp_path: Path) -> None:
    session = load_session(edited(tmp_path, with_script))
    html = export_session(session, "html")
    check_html(html)
    assert "<script" not in html.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    markdown = export_session(session, "md")
    assert SCRIPT in markdown, "kept verbatim inside code"
    assert not re.search(r"(?<!\\)<script", outside_code(markdown))
    assert "\\<script\\>" in markdown, "the description, escaped outside code"
    for plot in svgs_in(html):
        assert plot.find(f"{SVG}title") is not None


@pytest.mark.parametrize("same", [True, False], ids=["one-template", "two-templates"])
def test_a_conversation_exports_with_its_roles_and_each_lanes_formatted_prompt(
    tmp_path: Path, same: bool
) -> None:
    """A chat session's export shows the messages under their roles and the prompt each
    lane's template made (once where both made the same); JSON keeps both as fields."""
    messages = [
        {"role": "system", "content": "Be brief <script>\x1b[31m"},
        {"role": "user", "content": "Name a colour."},
    ]
    formatted = {
        lane_id: {"text": f"<{lane_id}>system Be brief\n<{lane_id}>user Name a colour.",
                  "token_ids": list(range(12 if lane_id == "a" or same else 15))}
        for lane_id in "ab"
    }  # fmt: skip
    if same:
        formatted["b"] = formatted["a"]

    def chat(lines: list[dict]) -> None:
        lines[0]["messages"] = messages
        lines[0]["lane_prompts"] = formatted

    session = load_session(edited(tmp_path, chat))
    markdown = export_session(session, "md")
    prompt = markdown.split("## Prompt", 1)[1]
    assert prompt.index("**system**") < prompt.index("**user**")
    assert "Be brief <script>␛[31m" in prompt and "\x1b" not in markdown
    if same:
        assert "**both lanes, as their chat template formats it (12 tokens)**" in prompt
    else:
        assert "**lane a, as its chat template formats it (12 tokens)**" in prompt
        assert "**lane b, as its chat template formats it (15 tokens)**" in prompt
    html = export_session(session, "html")
    check_html(html)
    assert "<script" not in html.lower()
    assert "&lt;a&gt;user Name a colour." in html
    # lane b's own prompt is shown only where its template made another one
    assert ("&lt;b&gt;user Name a colour." in html) is not same
    document = json.loads(export_session(session, "json"))
    assert document["messages"] == messages
    assert document["lane_prompts"] == formatted


def test_markdown_code_blocks_survive_backticks_in_model_text(tmp_path: Path) -> None:
    def fences(lines: list[dict]) -> None:
        step_of(lines, "a", 2)["piece"] = "\n```\n# not a heading | *x*"

    markdown = export_session(load_session(edited(tmp_path, fences)), "md")
    assert "````text\n" in markdown
    assert "# not a heading" not in outside_code(markdown)


@pytest.mark.parametrize("path", DEMOS, ids=lambda p: p.name.split("-", 1)[1])
def test_json_round_trips_and_agrees_with_the_comparison(path: Path) -> None:
    session = load_session(path)
    comparison = session.comparison()
    data = json.loads(export_session(session, "json"))
    assert data["schema"] == "specdiff-export" and data["version"] == 1
    summary = data["summary"]
    assert summary["fork_index"] == comparison.fork.index
    assert summary["fork_margins"] == [comparison.fork.a.margin, comparison.fork.b.margin]
    assert summary["fork"]["piece_a"] == comparison.fork.piece_a.decode()
    assert summary["near_ties"] == {
        "a": list(comparison.near_ties_a),
        "b": list(comparison.near_ties_b),
    }
    assert summary["similarity_after_fork"] == comparison.after_fork.similarity
    assert summary["tokens_per_second"] == list(session.footer.tokens_per_second)
    assert summary["output_sha256"] == list(session.footer.output_sha256)
    assert data["config"]["lanes"] == session.header.to_json()["lanes"]
    assert data["config"]["executed"] == session.header.executed
    assert data["config"]["build"] == session.header.build
    assert data["partial"] is False
    for lane in ("a", "b"):
        assert data["lanes"][lane]["text"] == text_of(session.steps[lane])
        assert data["lanes"][lane]["tokens"] == len(session.steps[lane])
        assert data["lanes"][lane]["recorded_sha256"] == data["lanes"][lane]["output_sha256"]


def test_json_through_the_cli_matches_load_session(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "r.json"
    assert run_cli(["export", str(UBATCH), "-o", str(output)], capsys)[0] == 0
    data = json.loads(output.read_text(encoding="utf-8"))
    assert data["summary"]["fork_index"] == load_session(UBATCH).comparison().fork.index


def test_near_tie_threshold_is_an_option(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["export", str(UBATCH), "--format", "json", "--near-tie", "0"], capsys)
    assert code == 0
    summary = json.loads(out)["summary"]
    assert summary["near_tie_threshold"] == 0
    assert summary["near_ties"] == {"a": [], "b": []}
    assert (
        json.loads(export_session(load_session(UBATCH), "json"))["summary"]["near_tie_threshold"]
        == DEFAULT_NEAR_TIE
    )


def test_lanes_without_a_fork_are_reported_identical(tmp_path: Path) -> None:
    def same_tokens(lines: list[dict]) -> None:
        steps_a = {line["index"]: line for line in lines if line.get("lane") == "a"}
        for line in lines:
            if line.get("lane") == "b":
                line.update({**steps_a[line["index"]], "lane": "b"})

    session = load_session(edited(tmp_path, same_tokens))
    for fmt in ("md", "html", "json"):
        assert "identical: both lanes produced the same 200 tokens" in export_session(session, fmt)
    html = export_session(session, "html")
    check_html(html)
    assert "<mark id=" not in html and "fork at" not in html
    assert json.loads(export_session(session, "json"))["summary"]["identical"] is True


# --- partial sessions ---------------------------------------------------------------


def test_a_partial_session_exports_in_every_format_and_says_partial(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = partial_copy(tmp_path, 30)
    session = load_session(path)
    assert session.partial
    for fmt in ("md", "html", "json"):
        output = tmp_path / f"out.{fmt}"
        assert run_cli(["export", str(path), "-o", str(output)], capsys)[0] == 0
        text = output.read_text(encoding="utf-8")
        assert "partial" in text
        assert "forked at token 11 of 30" in text
    data = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    assert data["partial"] is True
    assert data["summary"]["tokens_per_second"] == [None, None]
    assert data["lanes"]["a"]["output_sha256"] is None
    assert data["lanes"]["a"]["tokens"] == 30
    assert '<span class="state partial">' in (tmp_path / "out.html").read_text(encoding="utf-8")


def test_a_partial_session_that_has_not_forked_yet(tmp_path: Path) -> None:
    session = load_session(partial_copy(tmp_path, 8))
    for fmt in ("md", "html", "json"):
        text = export_session(session, fmt)
        assert "partial (the run did not finish): no fork in the tokens recorded" in text
        assert "⟦" not in text and "<mark id=" not in text
    check_html(export_session(session, "html"))
    assert json.loads(export_session(session, "json"))["summary"]["fork_index"] is None


def test_a_header_only_session_exports(tmp_path: Path) -> None:
    session = load_session(partial_copy(tmp_path, 0))
    for fmt in ("md", "html", "json"):
        assert "partial" in export_session(session, fmt)
    check_html(export_session(session, "html"))


# --- awkward model output -------------------------------------------------------------


def test_non_utf8_bytes_and_split_characters(tmp_path: Path) -> None:
    def bytes_(lines: list[dict]) -> None:
        first, second, third = (step_of(lines, "a", i) for i in range(3))
        for step, hex_bytes in ((first, "e282"), (second, "ac"), (third, "ff")):
            del step["piece"]
            step["piece_hex"] = hex_bytes
        step_of(lines, "b", 4)["piece"] = "\x1b[31m\x00"

    session = load_session(edited(tmp_path, bytes_))
    text = text_of(session.steps["a"])
    assert text.startswith("€\ufffd")
    assert "".join(token_texts(session.steps["a"])) == text
    data = json.loads(export_session(session, "json"))
    assert data["lanes"]["a"]["text"] == text
    html = export_session(session, "html")
    check_html(html)
    assert "€" in html and "\x1b" not in html and "\x00" not in html
    markdown = export_session(session, "md")
    assert "€" in markdown and "\x1b" not in markdown
    assert "␛[31m␀" in markdown


@pytest.mark.parametrize("path", DEMOS, ids=lambda p: p.name.split("-", 1)[1])
def test_token_texts_join_to_the_whole_text(path: Path) -> None:
    session = load_session(path)
    for lane in ("a", "b"):
        steps = session.steps[lane]
        assert "".join(token_texts(steps)) == text_of(steps)
        assert len(token_texts(steps)) == len(steps)


def test_an_infinite_margin_becomes_null_in_json_and_a_capped_point_in_the_plot(
    tmp_path: Path,
) -> None:
    def single_candidate(lines: list[dict]) -> None:
        for lane in ("a", "b"):
            step = step_of(lines, lane, 0)
            step["top"] = step["top"][:1]

    session = load_session(edited(tmp_path, single_candidate))
    assert math.isinf(session.steps["a"][0].margin)
    raw = export_session(session, "json")
    assert "Infinity" not in raw
    assert json.loads(raw)["lanes"]["a"]["margins"][0] is None
    check_html(export_session(session, "html"))
    export_session(session, "md")


# --- bad input --------------------------------------------------------------------------


def not_a_session(tmp_path: Path) -> list[str]:
    path = tmp_path / "notes.jsonl"
    path.write_text("hello\n", encoding="utf-8")
    return ["export", str(path), "-o", str(tmp_path / "out.md")]


def existing_output(tmp_path: Path) -> list[str]:
    (tmp_path / "out.md").write_text("keep me\n", encoding="utf-8")
    return ["export", str(UBATCH), "-o", str(tmp_path / "out.md")]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (lambda t: ["export", str(t / "missing.jsonl"), "-o", str(t / "o.md")], "not found"),
        (not_a_session, "notes.jsonl:1"),
        (existing_output, "--force"),
        (lambda t: ["export", str(UBATCH), "--format", "pdf", "-o", str(t / "o.md")], "pdf"),
        (lambda t: ["export", str(UBATCH), "-o", str(t / "nowhere" / "o.md")], "does not exist"),
        (lambda t: ["export", str(UBATCH), "-o", str(t)], "folder"),
        (lambda t: ["export", str(UBATCH), "--near-tie", "-1", "-o", str(t / "o.md")], "near-tie"),
        (lambda t: ["export"], "session"),
    ],
    ids=[
        "missing file",
        "not a session",
        "existing output",
        "unknown format",
        "missing folder",
        "output is a folder",
        "negative near tie",
        "no session",
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], arguments, message: str
) -> None:
    argv = arguments(tmp_path)
    before = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    code, out, err = run_cli(argv, capsys)
    assert code == 2
    assert out == ""
    assert err.startswith("specdiff: error: ") and err.count("\n") == 1, err
    assert message in err
    after = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    assert after == before


def test_force_overwrites(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "out.md"
    output.write_text("old\n", encoding="utf-8")
    assert run_cli(["export", str(UBATCH), "-o", str(output), "--force"], capsys)[0] == 0
    assert output.read_text(encoding="utf-8").startswith("# specdiff ubatch")


def test_a_failed_write_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    output = tmp_path / "out.md"
    output.write_text("old\n", encoding="utf-8")

    def refuse(_source: object, _target: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files_module.os, "replace", refuse)
    # a full disk is lost output (exit 1), not bad input
    with pytest.raises(files_module.OutputLost, match="No space left on device"):
        write_report("new\n", output, force=True)
    assert output.read_text(encoding="utf-8") == "old\n"
    assert [path.name for path in tmp_path.iterdir()] == ["out.md"]


def test_an_unknown_format_is_an_export_error() -> None:
    with pytest.raises(ExportError, match="choose one of md, html, json"):
        export_session(load_session(UBATCH), "pdf")


# --- svgplot --------------------------------------------------------------------------

INF, NAN = math.inf, math.nan

EDGE_CASES = {
    "no steps": ([], [], None),
    "one step": ([0.3], [0.3], None),
    "one empty lane": ([0.1, 2.0, 0.4], [], None),
    "no fork": ([0.2, 1.5, 3.0], [0.2, 1.5, 3.0], None),
    "infinite margins": ([INF, 0.1, INF], [INF, 0.2, 0.3], 1),
    "nan gap": ([0.1, NAN, 0.3], [0.2, 0.2, 0.2], None),
    "huge margin": ([250.0, 0.01, 7.0], [0.5, 0.02, 9.0], 1),
    "fork at the only step": ([0.0], [0.0], 0),
}


def parse_svg(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    assert re.fullmatch(r"0 0 \d+ \d+", root.get("viewBox", ""))
    assert root[0].tag == f"{SVG}title" and root[0].text
    assert not re.findall(r"https?://", svg.replace(f'xmlns="{SVG_NAMESPACE}"', ""))
    assert "<script" not in svg and "href" not in svg
    return root


def texts(root: ET.Element) -> list[str]:
    return ["".join(node.itertext()) for node in root.iter(f"{SVG}text")]


@pytest.mark.parametrize("case", EDGE_CASES.values(), ids=EDGE_CASES.keys())
def test_margin_plot_edge_cases(case: tuple[list[float], list[float], int | None]) -> None:
    margins_a, margins_b, fork = case
    root = parse_svg(margin_plot(margins_a, margins_b, fork_index=fork))
    labels = texts(root)
    assert "token index" in labels
    assert any("clipped at 4" in label for label in labels)
    assert any(label.startswith("near tie < 0.5") for label in labels)
    assert any(label == f"fork at {fork}" for label in labels) == (fork is not None)
    plotted = [c for c in root.iter(f"{SVG}circle")]
    finite_or_inf = [m for m in (*margins_a, *margins_b) if not math.isnan(m)]
    assert len(plotted) == len(finite_or_inf)
    for circle in plotted:  # a capped margin stays inside the plot area
        assert TOP <= float(circle.get("cy")) <= HEIGHT
    if not margins_a and not margins_b:
        assert "no steps recorded" in labels


def test_margin_plot_marks_capped_points_as_open_circles() -> None:
    root = parse_svg(margin_plot([100.0, 0.2], [INF, 0.3]))
    fills = [circle.get("fill") for circle in root.iter(f"{SVG}circle")]
    assert fills.count("none") == 2


def test_the_near_tie_line_is_dashed_and_the_fork_line_solid() -> None:
    root = parse_svg(margin_plot([0.1, 0.2, 3.0], [0.1, 0.6, 2.0], fork_index=1, near_tie=0.25))
    lines = list(root.iter(f"{SVG}line"))
    dashed = [line for line in lines if line.get("stroke-dasharray") == "6 4"]
    assert len(dashed) == 1 and dashed[0].get("y1") == dashed[0].get("y2")
    fork = [line for line in lines if line.get("class") == "sdp-rule"]
    assert len(fork) == 1 and fork[0].get("x1") == fork[0].get("x2")
    assert "near tie < 0.25" in texts(root)


def test_titles_and_labels_are_escaped() -> None:
    title = 'a <b> & "c" \x01 end'
    root = parse_svg(
        line_chart(
            [Series("x < y", [1.0, 2.0])],
            title=title,
            x_label="<x>",
            y_label="&y",
        )
    )
    assert root[0].text == 'a <b> & "c" \\x01 end'  # shown as its escape
    assert {"<x>", "&y", "x < y"} <= set(texts(root))
    assert xml_text("<&>\"'") == "&lt;&amp;&gt;&quot;&#39;"


def test_histogram_draws_one_bar_per_bin() -> None:
    root = parse_svg(
        histogram([3, 0, 7.5, INF, -2], ["0", "1", "2", "<3>", "4"], title="t", x_label="bins")
    )
    bars = list(root.iter(f"{SVG}rect"))
    assert len(bars) == 5
    assert [float(bar.get("height")) > 0 for bar in bars] == [True, False, True, False, False]
    assert "<3>" in texts(root)


def test_histogram_without_bins_and_with_mismatched_labels() -> None:
    root = parse_svg(histogram([], [], title="empty", x_label="bins"))
    assert "no data" in texts(root)
    with pytest.raises(ValueError, match="2 counts but 1 labels"):
        histogram([1, 2], ["a"], title="t", x_label="x")


def test_line_chart_picks_a_range_that_shows_every_finite_value() -> None:
    root = parse_svg(
        line_chart(
            [Series("s", [0.0, 12.0, 5.0]), Series("t", [])],
            title="t",
            x_label="x",
            y_label="y",
        )
    )
    fills = [circle.get("fill") for circle in root.iter(f"{SVG}circle")]
    assert "none" not in fills


def test_a_long_series_is_a_line_without_points() -> None:
    root = parse_svg(margin_plot([0.3] * (MAX_POINTS + 1), [0.4] * 10, fork_index=5))
    circles = list(root.iter(f"{SVG}circle"))
    assert len(circles) == 10
    assert len(list(root.iter(f"{SVG}polyline"))) == 2


@pytest.mark.parametrize("path", DEMOS, ids=lambda p: p.name.split("-", 1)[1])
def test_every_format_says_why_it_forked(path: Path) -> None:
    session = load_session(path)
    why = run_fork_account(session.steps["a"], session.steps["b"], near_tie=DEFAULT_NEAR_TIE)
    assert why is not None
    # an export has room for the probabilities, not only the logits
    assert "%" in why and "in logits:" in why
    data = json.loads(export_session(session, "json"))
    # the headline is the top-level verdict; the summary's sentence says why
    assert data["summary"]["why"] == why and "verdict" not in data["summary"]
    assert data["verdict"] != why
    kind = why.split(":", 1)[0]
    for fmt in ("md", "html"):
        report = export_session(session, fmt)
        assert f"Why it forked: {kind}:" in report


def export_to_a_terminal(arguments: list[str], cwd: Path) -> tuple[int, str, str]:
    """`specdiff export` in a real process whose stdout is a pseudo-terminal, read while
    it runs (a terminal's buffer holds a few kilobytes, a report more)."""
    leader, follower = pty.openpty()
    shown = bytearray()
    with subprocess.Popen(
        [sys.executable, "-m", "specdiff", "export", *arguments],
        stdout=follower,
        stderr=subprocess.PIPE,
        cwd=cwd,
    ) as process:
        os.close(follower)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if select.select([leader], [], [], 0.1)[0]:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # the terminal closes when the process exits
                    break
                if not chunk:
                    break
                shown += chunk
            elif process.poll() is not None:
                break
        os.close(leader)
        err = process.stderr.read().decode("utf-8", "replace") if process.stderr else ""
        code = process.wait(timeout=60)
    return code, shown.decode("utf-8", "replace").replace("\r\n", "\n"), err


@pytest.mark.parametrize("fmt", ["md", "html", "json"])
def test_a_terminal_gets_the_report_as_a_file_beside_the_session(tmp_path: Path, fmt: str) -> None:
    session = tmp_path / UBATCH.name
    session.write_bytes(UBATCH.read_bytes())
    code, shown, err = export_to_a_terminal([str(session), "--format", fmt], tmp_path)
    written = tmp_path / (UBATCH.name.removesuffix(".jsonl") + f".{fmt}")
    assert code == 0, err
    assert shown == "" and "base64" not in err
    assert f"wrote {written}" in err
    assert written.read_text(encoding="utf-8") == export_session(load_session(session), fmt)
    # a second export to the same name refuses, naming the file and the fix; --force replaces
    written.write_text("older\n", encoding="utf-8")
    code, _, err = export_to_a_terminal([str(session), "--format", fmt], tmp_path)
    assert code == 2 and str(written) in err and "--force" in err and err.count("\n") == 1
    assert written.read_text(encoding="utf-8") == "older\n"
    code, _, _ = export_to_a_terminal([str(session), "--format", fmt, "--force"], tmp_path)
    assert code == 0 and written.read_text(encoding="utf-8") != "older\n"


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """A folder nobody may write into: root ignores permission bits, not the immutable
    attribute."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)
        return
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
        pytest.skip("root here cannot make a folder read-only (no chattr +i)")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


def test_a_read_only_session_folder_sends_the_report_to_the_current_folder(
    tmp_path: Path,
) -> None:
    folder, here = tmp_path / "shared", tmp_path / "here"
    folder.mkdir()
    here.mkdir()
    session = folder / UBATCH.name
    session.write_bytes(UBATCH.read_bytes())
    with read_only(folder):
        code, _, err = export_to_a_terminal([str(session), "--format", "html"], here)
    assert code == 0, err
    written = here / (UBATCH.name.removesuffix(".jsonl") + ".html")
    assert [path.name for path in here.iterdir()] == [written.name]
    assert sorted(path.name for path in folder.iterdir()) == [UBATCH.name]
    assert written.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_a_pipe_or_dash_still_gets_the_report_on_stdout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    session = tmp_path / UBATCH.name
    session.write_bytes(UBATCH.read_bytes())
    code, shown, err = export_to_a_terminal([str(session), "-o", "-"], tmp_path)
    assert code == 0 and shown.startswith("# specdiff ubatch") and err == ""
    piped = subprocess.run(
        [sys.executable, "-m", "specdiff", "export", str(session), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert piped.returncode == 0 and json.loads(piped.stdout)["pair"] == "ubatch"
    assert [path.name for path in tmp_path.iterdir()] == [UBATCH.name]


def test_an_autopsy_saved_beside_a_session_is_in_every_format(tmp_path: Path) -> None:
    import shutil

    from specdiff.autopsy import load_saved
    from specdiff.reports.export import AUTOPSY_HEADING

    data = ROOT / "tests" / "data"
    session_path = tmp_path / "ubatch-roman-empire.jsonl"
    shutil.copy(data / session_path.name, session_path)
    alone = load_session(session_path)
    assert AUTOPSY_HEADING not in export_session(alone, "md")
    assert "autopsy" not in json.loads(export_session(alone, "json"))

    saved = tmp_path / "ubatch-roman-empire.autopsy.json"
    shutil.copy(data / saved.name, saved)
    session = load_session(session_path)
    autopsy = load_saved(saved).with_lanes(session.pair.a, session.pair.b)
    markdown = export_session(session, "md")
    assert AUTOPSY_HEADING in markdown and autopsy.cause() in " ".join(markdown.split())
    html = export_session(session, "html")
    assert AUTOPSY_HEADING.removeprefix("## ") in html and "<svg" in html
    exported = json.loads(export_session(session, "json"))["autopsy"]
    recorded = json.loads(saved.read_text())
    # the cause names what the pair's lanes did before the fork, as explain names it
    assert "n_ubatch 512 and 2" in exported.pop("kv_history") and "n_ubatch" in exported["cause"]
    assert exported.pop("cause") != recorded.pop("cause")
    assert exported == recorded

    # an autopsy of another pair beside the file is not this session's
    other = json.loads(saved.read_text())
    other["pair"] = "spec-vs-plain"
    saved.write_text(json.dumps(other))
    assert AUTOPSY_HEADING not in export_session(load_session(session_path), "md")


@pytest.mark.parametrize("fmt", ["html", "md", "json"])
def test_an_infinite_margin_in_a_saved_autopsy_is_one_line_in_every_format(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    """Python's json reads `"margin": Infinity`; the HTML export once died on it with an
    OverflowError in the growth chart while Markdown and JSON printed an "inf margin"."""
    import shutil

    data = ROOT / "tests" / "data"
    session = tmp_path / "ubatch-roman-empire.jsonl"
    shutil.copy(data / session.name, session)
    saved = json.loads((data / "ubatch-roman-empire.autopsy.json").read_text("utf-8"))
    saved["margin"]["margin"] = math.inf
    autopsy_path = tmp_path / "ubatch-roman-empire.autopsy.json"
    autopsy_path.write_text(json.dumps(saved), encoding="utf-8")
    assert '"margin": Infinity' in autopsy_path.read_text("utf-8")
    before = {path: path.read_bytes() for path in tmp_path.iterdir()}

    code, out, err = run_cli(["export", str(session), "--format", fmt], capsys)
    assert (code, out) == (2, "")
    assert err.startswith("specdiff: error: ") and err.count("\n") == 1, err
    assert "ubatch-roman-empire.autopsy.json: field 'margin.margin'" in err
    assert "must be a finite number, got Infinity" in err and "write a finite number" in err
    assert {path: path.read_bytes() for path in tmp_path.iterdir()} == before
