"""Text a newcomer reads, at the width of their terminal: the one wrapping rule every
command's text follows (explain, verify and certify as run), explain's short names
explained, the cause naming what the pair did before the fork, and the fork panel's and
a held near tie's numbers in words. Pure functions and saved records: no model."""

from __future__ import annotations

import argparse
import io
from dataclasses import replace
from pathlib import Path

import pytest

from specdiff.autopsy import Autopsy, load_saved
from specdiff.cli import common
from specdiff.fork_words import held_tie_sentence, margins_words, ordinal
from specdiff.lanes import presets
from specdiff.sessions.store import load_session
from specdiff.tui.view_state import CompareView

DATA = Path(__file__).parent / "data"
SESSION = DATA / "ubatch-roman-empire.jsonl"
SAVED = DATA / "ubatch-roman-empire.autopsy.json"


def words(text: str) -> list[str]:
    return text.split()


def fits(text: str, columns: int) -> bool:
    """Every line leaves the terminal's last column free (no line wraps by itself)."""
    return all(len(line) < columns for line in text.splitlines())


def shown_autopsy() -> Autopsy:
    pair = load_session(SESSION).pair
    return load_saved(SAVED).with_lanes(pair.a, pair.b)


# -- one width rule


def test_wrapping_breaks_lines_between_words_only_and_keeps_tokens_whole() -> None:
    line = (
        "   At token 30 lane a picked ',' (39% against 36% for ' that') and lane b picked "
        "' that' (39% against 37%); in logits lane a's lead was 0.084 and AVX2 = 1 held"
    )
    text = common.wrapped_text(line, 80)
    assert fits(text, 80) and len(text.splitlines()) == 3
    assert words(text) == words(line)  # no word cut, none lost
    assert "' that'" in text.replace("\n", " ") and "AVX2 = 1" in text.replace("\n", " ")
    assert all(row.startswith("   ") for row in text.splitlines())  # under its own indent
    assert common.wrapped_text(line, None) == line  # a file or a pipe: as it was


def test_text_columns_is_the_terminals_width_at_least_40(monkeypatch) -> None:
    for terminal, laid_out in ((80, 80), (20, common.MIN_TEXT_COLUMNS), (None, None)):
        monkeypatch.setattr(common, "terminal_columns", lambda _stream, t=terminal: t)
        assert common.text_columns(io.StringIO()) == laid_out


def test_run_explain_verify_and_certify_use_the_one_rule(monkeypatch) -> None:
    from specdiff.cli import certify, explain, run, verify

    for module in (run, explain):
        assert module.text_columns is common.text_columns
    assert certify.for_terminal is common.for_terminal
    assert verify.command_verify.__wrapped__ is not None  # text_output wraps its prints
    monkeypatch.setattr(common, "terminal_columns", lambda _stream: 72)
    monkeypatch.setattr(run, "text_columns", common.text_columns)
    assert run.terminal_layout().width == 72


def test_a_text_command_prints_wrapped_on_a_terminal(monkeypatch, capsys) -> None:
    long = "verified: all 120 recorded steps came out again " * 3

    @common.text_output
    def command(_args: argparse.Namespace) -> int:
        print(long.strip())
        print("  note: " + "a change " * 12, end="")
        return 0

    monkeypatch.setattr(common, "terminal_columns", lambda _stream: 80)
    assert command(argparse.Namespace()) == 0
    out = capsys.readouterr().out
    assert fits(out, 80) and words(out) == words(long) + words("note: " + "a change " * 12)
    monkeypatch.setattr(common, "terminal_columns", lambda _stream: None)
    command(argparse.Namespace())
    assert capsys.readouterr().out.splitlines()[0] == long.strip()  # a pipe: one line


def test_certifys_text_fits_the_terminal(monkeypatch, capsys) -> None:
    from specdiff.cli.certify import report
    from tests.test_certify import SPECULATION, certificate, not_tested

    data = certificate([not_tested(SPECULATION, "no second endpoint " * 8)])
    monkeypatch.setattr(common, "terminal_columns", lambda _stream: 80)
    args = argparse.Namespace(json=False, html=None, quiet=True, require=[], property=[])
    report(args, data)
    out = capsys.readouterr().out
    assert fits(out, 80) and " ".join(out.split()).count("no second endpoint") == 8


# -- explain's text


def test_explain_at_80_columns_wraps_between_words_and_keeps_the_table_one_row_each() -> None:
    from specdiff.cli.explain import autopsy_text

    autopsy = shown_autopsy()
    text = autopsy_text(autopsy, 80)
    assert fits(text, 80)
    flat = " ".join(text.split())
    assert " ".join(autopsy.cause().split()) in flat  # the cause whole, wrapped once
    table = [line for line in text.splitlines() if "(cached)" in line]
    assert len(table) == len(autopsy.trials)  # each trial a row of its own
    assert all(
        line.rstrip().endswith(f"{t.speed_a:.1f}/{t.speed_b:.1f}")
        for line, t in zip(table, autopsy.trials)
    )
    from specdiff.reports.autopsy import format_autopsy

    # a file or a pipe: the report's own lines, then the words, each entry on one line
    piped = autopsy_text(autopsy, None)
    assert piped.startswith(format_autopsy(autopsy) + "\n\nWords\n")
    assert piped.splitlines()[-len(autopsy.legend()) :] == [f"   {e}" for e in autopsy.legend()]


def test_explain_says_what_cont_rel_l2_and_each_mark_of_the_growth_line_mean() -> None:
    from specdiff.cli.explain import autopsy_text

    autopsy = shown_autopsy()
    text = " ".join(autopsy_text(autopsy, None).split())
    assert "CONT: the operation that computed the first differing tensor" in text
    assert "no arithmetic" in text
    assert "rel L2 (relative L2): the size of the whole difference" in text
    series = autopsy.growth_series()
    blank = sum(1 for value in series if value == 0)
    assert f"one mark per value, {len(series)} in all" in text
    assert f"a blank ({blank} here) is bit-identical" in text


def test_the_ubatch_cause_names_the_prompts_batches_not_verify_batches() -> None:
    cause = shown_autopsy().cause()
    assert "verify batches" not in cause
    assert "up to 512 at a time in lane a and 2 at a time in lane b" in cause
    assert "n_ubatch 512 and 2" in cause


def test_a_ubatch_fork_in_the_caches_history_reads_as_the_prompts_batches() -> None:
    from specdiff.cli.explain import autopsy_text

    shown = shown_autopsy()
    first = shown.first_difference
    assert first is not None
    cache = replace(first, name="cache_k_l11", op="SET_ROWS", kv_history=True)
    autopsy = replace(shown, tensors=tuple(cache if t == first else t for t in shown.tensors))
    cause = autopsy.cause()
    assert "The first difference is in layer 11's K cache (cache_k_l11)" in cause
    assert "written by earlier decode calls, not computed in this step" in cause
    assert "up to 512 at a time in lane a and 2 at a time in lane b" in cause
    text = autopsy_text(autopsy, 80)
    assert fits(text, 80) and " ".join(cause.split()) in " ".join(text.split())
    assert "KV history: the difference lies in KV cache entries" in " ".join(text.split())


@pytest.mark.parametrize(
    ("pair", "said"),
    [
        ("spec-vs-plain", "checked its drafted tokens up to"),
        ("cache-vs-fresh", "a cached prefix"),
        ("ubatch", "n_ubatch 512 and 2"),
    ],
)
def test_kv_history_reads_the_pairs_lanes(pair: str, said: str) -> None:
    lanes = presets()[pair]
    assert said in Autopsy("p", 10, 3).with_lanes(lanes.a, lanes.b).kv_history


def test_kv_history_is_saved_and_an_older_file_reads_without_it() -> None:
    autopsy = shown_autopsy()
    assert Autopsy.from_json(autopsy.to_json()) == autopsy
    assert load_saved(SAVED).kv_history == ""  # written before it was kept


# -- the fork panel and the notes, in words


def test_the_fork_margins_have_their_unit_and_the_ranks_in_words() -> None:
    fork = load_session(SESSION).comparison().fork
    assert fork is not None
    line = margins_words(fork)
    assert line.startswith(f"margins a {fork.a.margin:.3f} · b {fork.b.margin:.3f} logits")
    assert "each lane ranked the other's pick 2nd" in line
    assert "#" not in line
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22)] == [
        "1st",
        "2nd",
        "3rd",
        "4th",
        "11th",
        "12th",
        "13th",
        "21st",
        "22nd",
    ]


def test_a_near_tie_that_held_says_why() -> None:
    session = load_session(SESSION)
    a, b = session.steps["a"][2], session.steps["b"][2]
    said = held_tie_sentence(a, b)
    assert said is not None
    assert f"by {a.margin:.3f} logits in lane a" in said
    runner = a.top[1].token_id
    lead_b = b.logit_of(a.token_id) - b.logit_of(runner)
    assert f"{lead_b:.3f} in lane b" in said
    assert f"moved the lead by {abs(a.margin - lead_b):.3f}, less than the lead" in said
    fork = session.comparison().fork
    assert held_tie_sentence(session.steps["a"][fork.index], session.steps["b"][fork.index]) is None


def test_the_no_tie_note_fits_an_80_column_status_line() -> None:
    session = load_session(SESSION)
    view = CompareView(session.pair)
    view.show_session(session)
    view.add(session.steps["a"])
    view.add(session.steps["b"])
    view.update_comparison()
    view.select("a", view.fork.index)
    note = view.no_tie_note("after")
    assert len(note) <= 78 and "near ties end there" in note
