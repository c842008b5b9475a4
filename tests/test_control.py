"""The noise-floor control (--control): lane a run again, cold, beside the pair.

In-process lanes are deterministic, so their control matches lane a token for token on
the real model; a server that answers each request differently (tests/servers.py's
drift mode) makes a vs a' fork, and the fork of a vs b is then the noise floor."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from specdiff.cli import main
from specdiff.control import control_brief, control_sentence, warm_second_run
from specdiff.lanes import Lane, presets
from specdiff.sessions.records import (
    CUT_SHORT,
    EFFECT,
    NOISE_FLOOR,
    ControlRun,
    RunSummary,
    noise_floor_label,
)
from specdiff.sessions.store import load_session
from specdiff.steps import Candidate, TokenStep
from specdiff.suite import SuiteError
from specdiff.suite.prompts import SuitePrompt
from specdiff.suite.settings import SuiteSettings, check_resume, settings_from_json
from tests.servers import fault_server
from tests.tui_driver import drive


def step(index: int, token_id: int, margin: float = 1.0) -> TokenStep:
    top = (Candidate(token_id, 0.0), Candidate(token_id + 1, -margin))
    return TokenStep("a", index, token_id, b"x", top, False, 1, 0.0)


@pytest.mark.parametrize(
    ("fork", "control_fork", "control_length", "label"),
    [
        (None, None, 10, None),  # no fork: nothing to label
        (None, 3, 10, None),
        (5, 5, 10, NOISE_FLOOR),  # a vs a' forked at the same step
        (5, 0, 10, NOISE_FLOOR),  # ... or before it
        (5, 6, 10, EFFECT),  # a' agreed through the fork, forked later
        (5, None, 10, EFFECT),  # a' identical
        (5, None, 5, CUT_SHORT),  # a' stopped before reaching the fork
        (0, None, 0, CUT_SHORT),
    ],
)
def test_the_label_follows_where_a_vs_a_prime_forks(fork, control_fork, control_length, label):
    assert noise_floor_label(fork, control_fork, control_length) == label


@pytest.mark.parametrize(
    ("first", "again", "fork"),
    [
        ([1, 2, 3], [1, 2, 3], None),
        ([1, 2, 3], [1, 9, 3], 1),
        ([1, 2, 3], [1, 2], None),  # cut short: a prefix, no fork
        ([4], [5], 0),
    ],
)
def test_a_control_record_survives_its_footer(first, again, fork):
    a = [step(i, t) for i, t in enumerate(first)]
    a_again = [step(i, t, margin=0.25) for i, t in enumerate(again)]
    control = ControlRun.of_steps(a, a_again, "length", None)
    assert control.fork_index == fork
    assert control.identical == (fork is None)
    summary = RunSummary.of_steps(a, a, control=control)
    record = json.loads(json.dumps(summary.to_json()))
    assert record["control"]["label"] == summary.control_label
    assert RunSummary.from_json(record).control == control
    if fork is not None:
        assert control.fork_margins == (1.0, 0.25)


@pytest.mark.parametrize(
    ("ab", "again", "stop", "error", "sentence", "brief"),
    [
        ([1, 2, 3], [1, 2, 3], "length", None, "same tokens as lane a over 3; a and b agreed",
         "control: a' = a"),
        ([1, 2, 3], [1, 9, 3], "length", None, "at token 1 (margins 1.000 / 0.250); though a "
         "and b agreed", "control: a' forked at 1"),
        ([1, 7, 3], [1, 9, 3], "length", None, "the fork at token 1 is the noise floor",
         "control: noise floor (a' forked at 1)"),
        ([1, 2, 7], [1, 2, 3], "length", None, "the fork at token 2 is an effect",
         "control: effect (a' = a)"),
        ([1, 2, 7], [1], "cancelled", None, "it stopped (cancelled) before the fork at token 2",
         "control: control cut short (a' = a)"),
        ([1, 2, 7], [1], "", "\x1b]0;x\x07 broke", "failed after 1 token: \\x1b]0;x\\x07 broke",
         "control failed"),
    ],
)  # fmt: skip
def test_the_control_reads_as_one_line(ab, again, stop, error, sentence, brief):
    a = [step(i, t) for i, t in enumerate([1, 2, 3])]
    b = [step(i, t) for i, t in enumerate(ab)]
    a_again = [step(i, t, margin=0.25) for i, t in enumerate(again)]
    summary = RunSummary.of_steps(a, b, control=ControlRun.of_steps(a, a_again, stop, error))
    line = control_sentence(summary)
    assert line is not None and line.startswith("control (lane a again, cold): ")
    assert line.endswith(sentence) and "\x1b" not in line
    assert control_brief(summary) == brief
    assert control_sentence(RunSummary.of_steps(a, b)) is None


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("fork_index", "2", "control.fork_index"),
        ("fork_index", -1, "control.fork_index"),
        ("fork_index", 5, "past control.generated 4"),  # a' forks at most where it ended
        ("generated", None, "control.generated"),
        ("generated", 1.5, "control.generated"),
        ("output_sha256", 7, "control.output_sha256"),
        ("stop_reason", ["length"], "control.stop_reason"),
        ("error", {"x": 1}, "control.error"),
        ("fork_margins", [1.0], "fork_margins"),
    ],
)
def test_a_control_of_the_wrong_type_is_named(field, value, words):
    record = ControlRun(1, (0.5, math.inf), 4, "00", "length").to_json() | {field: value}
    with pytest.raises(ValueError, match=words):
        ControlRun.from_json(record)


@pytest.mark.parametrize("command", ["run", "live"])
@pytest.mark.parametrize(
    ("lane_a", "words"),
    [
        (["--pair", "server-cache-vs-fresh"], "prefix=cached"),
        (["--pair", "servers", "--lane-a", 'request={"cache_prompt": true}'], "cache_prompt"),
        # llama-server takes a value that is no JSON boolean as its default: caching
        (["--pair", "servers", "--lane-a", 'request={"cache_prompt": 1}'], '"cache_prompt": 1'),
        (["--pair", "servers", "--lane-a", 'request={"cache_prompt": "no"}'], '"no"'),
        (["--pair", "servers", "--lane-a", 'request={"cache_prompt": null}'], "null"),
    ],
)
def test_control_refuses_a_lane_a_whose_second_run_is_warm(command, lane_a, words, capsys):
    code = main([command, *lane_a, "--control", "--max-tokens", "4"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "--control runs lane a twice" in err and words in err


@pytest.mark.parametrize(
    ("request_fields", "warm"),
    [("", False), ('{"cache_prompt": false}', False), ('{"n_probs": 8}', False)]
    + [('{"cache_prompt": true}', True), ('{"cache_prompt": 0}', True)],
)
def test_only_an_explicit_false_keeps_a_server_lane_cold(request_fields, warm):
    lane = Lane(backend="server", endpoint="http://127.0.0.1:9", request=request_fields)
    assert (warm_second_run(lane) is not None) == warm


def suite_json(control: bool | None) -> dict:
    """A suite.json of one prompt and pair, with `control` as given (None: left out, as
    a suite written before the control was recorded)."""
    settings = SuiteSettings("prompts.jsonl", (presets()["ubatch"],), 8, control=bool(control))
    data = settings.as_json([SuitePrompt("p0", "Hello")])
    if control is None:
        del data["control"]
    return data


@pytest.mark.parametrize(("stored", "given"), [(None, True), (False, True), (True, False)])
def test_a_resume_that_changes_the_control_is_refused(stored, given, tmp_path: Path):
    resumed = SuiteSettings("prompts.jsonl", (presets()["ubatch"],), 8, control=given)
    with pytest.raises(SuiteError, match="the control given differ"):
        check_resume(suite_json(stored), resumed, [SuitePrompt("p0", "Hello")], tmp_path)


@pytest.mark.parametrize(("value", "read"), [(None, False), (True, True), (False, False)])
def test_suite_json_reads_the_control_and_defaults_it_off(value, read):
    assert settings_from_json(suite_json(value)).control is read


@pytest.mark.parametrize("wrong", ["yes", 1, None, [True]])
def test_a_suite_json_control_of_the_wrong_type_is_named(wrong):
    with pytest.raises(ValueError, match="control has the wrong type"):
        settings_from_json(suite_json(True) | {"control": wrong})


@pytest.mark.parametrize("where", [[], ["--endpoint", "http://127.0.0.1:9"]])
def test_repeat_refuses_control_saying_why(where, capsys):
    assert main(["repeat", *where, "--control", "-n", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith("specdiff: error: --control has no meaning for repeat") and "\n" not in err
    )


def run_json(arguments: list[str], capsys) -> tuple[int, dict]:
    code = main(["run", *arguments, "--control", "--json", "--quiet"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.model
def test_an_in_process_control_matches_lane_a_token_for_token(tmp_path: Path, capsys):
    """Lane a speculative: its second run drafts and verifies on contexts of its own."""
    arguments = ["--pair", "spec-vs-plain", "--max-tokens", "16", "--save"]
    code, record = run_json([*arguments, "--sessions-dir", str(tmp_path)], capsys)
    assert code in (0, 1)
    control = record["control"]
    assert control["fork_index"] is None and control["error"] is None
    assert control["generated"] == record["generated"][0] == 16
    assert control["output_sha256"] == record["output_sha256"][0]
    # a fork of a vs b, wherever it lands, is an effect: lane a alone is deterministic
    assert control["label"] == (None if record["fork_index"] is None else EFFECT)
    (saved,) = tmp_path.glob("*.jsonl")
    assert load_session(saved).summary().control == ControlRun.from_json(control)
    assert main(["export", str(saved), "-o", str(tmp_path / "r.md")]) == 0
    assert "Control (lane a again, cold): same tokens as lane a over 16" in (
        tmp_path / "r.md"
    ).read_text(encoding="utf-8")


@pytest.mark.server
@pytest.mark.model
@pytest.mark.parametrize(("lane_a_mode", "label"), [("drift", NOISE_FLOOR), ("steady", EFFECT)])
def test_a_server_control_tells_the_noise_floor_from_an_effect(
    lane_a_mode, label, tmp_path: Path, capsys
):
    """Lane b on a server that answers every request differently; lane a on the same
    server (its control forks too: noise floor) or on a steady one (an effect)."""
    with fault_server("drift") as drifting, fault_server(lane_a_mode) as other:
        lane_a = drifting if lane_a_mode == "drift" else other
        arguments = [
            "run", "--pair", "servers", "--lane-a", f"endpoint={lane_a}",
            "--lane-b", f"endpoint={drifting}", "--max-tokens", "5", "--control", "--quiet",
            "--save", "--sessions-dir", str(tmp_path),
        ]  # fmt: skip
        assert main(arguments) == 1
    (saved,) = tmp_path.glob("*.jsonl")
    summary = load_session(saved).summary()
    assert summary.fork_index == 2 and summary.control is not None
    assert summary.control_label == label
    assert summary.control.fork_index == (2 if label == NOISE_FLOOR else None)
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if line.startswith("control (lane a again")]
    if label == NOISE_FLOOR:
        assert "forked from lane a at token 2" in line
        assert line.endswith("the fork at token 2 is the noise floor")
    else:
        assert "same tokens as lane a over 4" in line
        assert line.endswith("the fork at token 2 is an effect")


@pytest.mark.server
@pytest.mark.model
def test_a_suite_control_gives_both_rates_and_refuses_a_resume_that_drops_it(
    tmp_path: Path, capsys
):
    """Both lanes on one drifting server: every prompt forks a vs b and a vs a' at its
    third token, so every fork is the noise floor."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"id": f"p{i}", "prompt": f"Say hello {i}."}) + "\n" for i in range(2))
    )
    report = tmp_path / "report"
    with fault_server("drift") as drifting:
        command = [
            "suite", str(prompts), "--pair", "servers", "--both", f"endpoint={drifting}",
            "--max-tokens", "5", "--report", str(report), "--quiet",
        ]  # fmt: skip
        assert main([*command, "--control"]) == 0
        out = capsys.readouterr().out
        assert json.loads((report / "suite.json").read_text())["control"] is True
        assert main([*command, "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("specdiff: error: the control given differ") and "\n" not in err
    assert "a vs a' 2/2 (noise floor) · 2 of 2 forks the noise floor" in out
    for file in (report / "sessions").rglob("*.jsonl"):
        summary = load_session(file).summary()
        assert summary.control_label == NOISE_FLOOR and summary.control.fork_index == 2
    markdown = (report / "report.md").read_text(encoding="utf-8")
    assert "| a vs b forked (controlled runs) | 2/2 |" in markdown
    assert "| a vs a' forked (noise floor rate) | 2/2 |" in markdown
    # each prompt's row labels its fork beside the fork's class
    for prompt_id in ("p0", "p1"):
        # a prompt is named by its id and the start of its text
        row = rf"\| {prompt_id}: [^|]+ \| 2 \([a-z -]+; noise floor\) \|"
        assert re.search(row, markdown), markdown


@pytest.mark.server
@pytest.mark.model
async def test_live_control_gives_its_label_in_the_status_line() -> None:
    """The TUI (live --control) on a drifting server: its status gives the control
    beside the fork, where a narrow line keeps it."""
    from specdiff.lanes import Lane, Pair
    from specdiff.tui.app import make_app
    from tests.conftest import wait_for

    with fault_server("drift") as drifting:
        lane = Lane(backend="server", endpoint=drifting)
        pair = Pair("drifting", lane, lane, "one server that answers each request differently")
        app = make_app({pair.name: pair}, pair.name, "Say hello.", 5, control=True)
        async with app.run_test(size=(200, 30)) as pilot:
            await wait_for(pilot, lambda: drive(app).result is not None)
            status = app.query_one("#status").plain
    assert drive(app).result is not None and drive(app).result.control is not None
    assert "forked at token 2 (a 4 tokens, b 4 tokens) · control: noise floor (a' forked at 2)" in (
        status
    )
