"""`suite --prompt-lengths`: the lengths are checked before anything runs, each prompt is
padded to each length (or skipped where it is longer), recorded in suite.json, and a
resume may not change them; the report tables and plots the fork rate by length."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from specdiff.cli import main
from specdiff.lanes import presets
from specdiff.sessions.store import load_session
from specdiff.suite import SuiteError
from specdiff.suite.lengths import FILLER, SEPARATOR, padded_prompt, parse_prompt_lengths
from specdiff.suite.prompts import SuitePrompt
from specdiff.suite.settings import SuiteSettings, check_resume, settings_from_json
from tests.in_process import specdiff_here


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("", "needs at least one token length"),
        (" , ", "needs at least one token length"),
        ("128,abc", "'abc' is not a whole number"),
        ("12.5", "'12.5' is not a whole number"),
        ("-4", "'-4' is not a whole number"),
        ("0,128", "0 is below 1 token"),
        ("128,512,128", "128 is given twice"),
        ("241", "241 tokens and --max-tokens 16 exceed lane a's n_ctx 256"),
    ],
)
def test_bad_lengths_are_refused_in_one_line(value: str, words: str, tmp_path: Path) -> None:
    report = tmp_path / "report"
    done = specdiff_here(
        "suite",
        "questions", "--report", str(report), "--pair", "ubatch", "--both", "n_ctx=256",
        "--max-tokens", "16", f"--prompt-lengths={value}",
    )  # fmt: skip
    err = done.stderr.strip()
    assert done.returncode == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("specdiff: error: --prompt-lengths") and words in err, err
    assert not report.exists()


@pytest.mark.parametrize(("value", "lengths"), [("128", (128,)), (" 512, 8 ,1", (512, 8, 1))])
def test_lengths_are_read_in_the_order_given(value: str, lengths: tuple[int, ...]) -> None:
    assert parse_prompt_lengths(value) == lengths


def by_words(text: str) -> Sequence[str]:
    return text.split()


def by_characters(text: str) -> Sequence[str]:
    return list(text)


def by_pairs_of_characters(text: str) -> Sequence[str]:
    return [text[i : i + 2] for i in range(0, len(text), 2)]


@pytest.mark.parametrize("tokenize", [by_words, by_characters, by_pairs_of_characters])
@pytest.mark.parametrize("length", [1, 7, 40, 300])
@pytest.mark.parametrize("text", ["Why is the sky blue?", "def f(x):\n    return", "ok"])
def test_a_padded_prompt_fills_its_length_and_ends_with_the_prompt(
    tokenize: Callable[[str], Sequence[str]], length: int, text: str
) -> None:
    prompt = SuitePrompt("p", text)
    padded = padded_prompt(prompt, length, tokenize)
    if len(tokenize(text)) > length:
        assert padded is None
        return
    assert padded is not None and padded.id == "p" and padded.prompt.endswith(text)
    tokens = len(tokenize(padded.prompt))
    assert tokens <= length
    if padded.prompt != text:
        assert padded.prompt.startswith(FILLER.split()[0]) and SEPARATOR in padded.prompt
    # one more filler word would not fit: the prompt is as long as the length allows
    longer = padded_prompt(prompt, length + len(tokenize(FILLER)), tokenize)
    assert longer is not None and len(tokenize(longer.prompt)) > tokens
    assert padded_prompt(prompt, length, tokenize) == padded  # the same on every run


def suite_json(lengths: tuple[int, ...] | None) -> dict:
    """A suite.json with `lengths` (None: left out, as before lengths were recorded)."""
    settings = SuiteSettings("p.jsonl", (presets()["ubatch"],), 8, prompt_lengths=lengths or ())
    data = settings.as_json([SuitePrompt("p0", "Hello")])
    if lengths is None:
        del data["prompt_lengths"]
    return data


@pytest.mark.parametrize(
    ("stored", "given"), [(None, (64,)), ((64,), ()), ((64, 128), (128, 64)), ((64,), (65,))]
)
def test_a_resume_that_changes_the_lengths_is_refused(stored, given, tmp_path: Path) -> None:
    resumed = SuiteSettings("p.jsonl", (presets()["ubatch"],), 8, prompt_lengths=given)
    with pytest.raises(SuiteError, match="the prompt lengths given differ"):
        check_resume(suite_json(stored), resumed, [SuitePrompt("p0", "Hello")], tmp_path)


@pytest.mark.parametrize("lengths", [None, (), (32,), (8, 64)])
def test_suite_json_reads_the_lengths_back(lengths) -> None:
    settings = settings_from_json(suite_json(lengths))
    assert settings.prompt_lengths == (lengths or ())
    labels = [label for label, _, _ in settings.variants()]
    assert labels == ([f"ubatch@{n}tok" for n in lengths] if lengths else ["ubatch"])
    assert [settings.prompt_length(label) for label in labels] == list(lengths or [None])


@pytest.mark.parametrize("wrong", ["64", 64, [64, "x"], [0], [True], None])
def test_suite_json_lengths_of_the_wrong_type_are_named(wrong) -> None:
    with pytest.raises(ValueError, match="prompt_lengths must be a list of whole numbers"):
        settings_from_json(suite_json((64,)) | {"prompt_lengths": wrong})


SHORT, LONG = "Name a colour.", "Explain, in one careful sentence, why the sea looks blue " * 2


@pytest.mark.model
def test_each_length_runs_as_a_variant_with_its_table_and_plot(tmp_path: Path, capsys) -> None:
    prompts = tmp_path / "p.jsonl"
    lines = [
        json.dumps({"id": "short", "prompt": SHORT}),
        json.dumps({"id": "long", "prompt": LONG}),
    ]
    prompts.write_text("\n".join(lines) + "\n", encoding="utf-8")
    report = tmp_path / "report"
    arguments = [
        "suite", str(prompts), "--report", str(report), "--pair", "spec-vs-plain", "--both",
        "n_ctx=128", "--max-tokens", "8",
    ]  # fmt: skip
    assert main([*arguments, "--prompt-lengths", "12,48", "--quiet"]) in (0, 1)
    data = json.loads((report / "report.json").read_text(encoding="utf-8"))
    assert data["settings"]["prompt_lengths"] == [12, 48]
    assert [(p["label"], p["prompt_length"]) for p in data["pairs"]] == [
        ("spec-vs-plain@12tok", 12),
        ("spec-vs-plain@48tok", 48),
    ]
    # the long prompt does not fit in 12 tokens: skipped there, counted in the report
    assert [p["summary"]["prompts"] for p in data["pairs"]] == [1, 2]
    (skipped,) = data["skipped_prompts"]
    assert (
        skipped.startswith("spec-vs-plain@12tok: ") and "longer than --prompt-lengths 12" in skipped
    )
    for session in report.rglob("*.jsonl"):
        header = load_session(session).header
        length = 12 if "12tok" in str(session) else 48
        assert length - 8 < len(header.prompt_token_ids) <= length, session
        assert header.prompt.endswith(SHORT if "short" in session.name else LONG)
    markdown = (report / "report.md").read_text(encoding="utf-8")
    assert "## Fork rate by prompt length" in markdown
    assert "| spec-vs-plain@12tok | 12 | 1 | 1 |" in markdown
    html = (report / "report.html").read_text(encoding="utf-8")
    assert "<title>Fork rate by prompt length</title>" in html
    capsys.readouterr()
    # a resume must run the lengths the suite started with
    assert main([*arguments, "--prompt-lengths", "48", "--resume", "--quiet"]) == 2
    assert "the prompt lengths given differ" in capsys.readouterr().err
    resume_only = ["suite", "--resume", "--report", str(report), "--prompt-lengths", "48"]
    assert main(resume_only) == 2
    assert "drop --prompt-lengths" in capsys.readouterr().err
