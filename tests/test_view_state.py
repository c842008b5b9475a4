"""The compare screen's rules as plain Python, without a screen or a model: where the
fork holds the cursor, where n, p, ←/→ and l take it, what a replay stepping back
forgets, what a stats line keeps; and the typed seams the screen reads (a failure's lane,
a lane's live numbers)."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest

from specdiff.engine.base import LiveStats
from specdiff.errors import ModelError, SpecdiffError, lane_failure
from specdiff.lanes import presets
from specdiff.steps import Candidate, TokenStep
from specdiff.tui.view_state import CompareView, fitted


def steps(lane: str, tokens: list[int], margins: list[float] | None = None) -> list[TokenStep]:
    """A lane's steps: token ids as given, each with its margin (1.0 unless given)."""
    margins = margins or [1.0] * len(tokens)
    return [
        TokenStep(
            lane=lane,
            index=index,
            token_id=token,
            piece=f"<{token}>".encode(),
            top=(Candidate(token, 10.0), Candidate(token + 1, 10.0 - margin)),
            drafted=False,
            verify_width=1,
            timestamp=float(index),
        )
        for index, (token, margin) in enumerate(zip(tokens, margins))
    ]


def view_of(a: list[TokenStep], b: list[TokenStep], near_tie: float = 0.5) -> CompareView:
    view = CompareView(presets()["ubatch"], near_tie)
    view.add([*a, *b])
    return view


def test_the_view_state_imports_no_textual() -> None:
    code = "import sys, specdiff.tui.view_state; print('textual' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_a_found_fork_holds_the_panes_and_takes_the_cursor() -> None:
    view = view_of(steps("a", [1, 2, 3]), steps("b", [1, 2]))
    assert not view.find_fork() and view.fork is None and view.follow
    view.add(steps("b", [1, 2, 9])[2:])
    assert view.find_fork()
    assert view.fork is not None and view.fork.index == 2
    assert view.cursor == 2 and not view.follow
    assert not view.find_fork()  # found once


def test_the_diff_after_the_fork_marks_what_only_one_lane_has() -> None:
    view = view_of(steps("a", [1, 5, 6, 7]), steps("b", [1, 8, 6, 7]))
    assert view.update_comparison()
    assert view.changed == {"a": {1}, "b": {1}}
    assert view.similarity is not None and 0 < view.similarity < 1


def test_n_and_p_go_through_the_current_lanes_near_ties_only() -> None:
    view = view_of(
        steps("a", [1, 2, 3, 4, 5], [0.1, 1.0, 0.2, 1.0, 0.3]),
        steps("b", [1, 2, 3, 4, 5], [1.0, 0.1, 1.0, 1.0, 1.0]),
    )
    assert view.next_tie() == 0 and view.previous_tie() is None
    view.select("a", 2)
    assert (view.next_tie(), view.previous_tie()) == (4, 0)
    view.select("a", 4)
    assert view.next_tie() is None
    view.select("b", 0)
    assert (view.next_tie(), view.previous_tie()) == (1, None)


def test_n_and_p_stop_at_the_fork_where_the_shading_stops() -> None:
    """Near ties after the fork (compared by index, though the contexts differ) are not
    shaded, so n does not go there either, and says why."""
    view = view_of(
        steps("a", [1, 2, 3, 4, 5, 6], [1.0, 0.1, 1.0, 0.2, 0.1, 1.0]),
        steps("b", [1, 2, 3, 9, 5, 6]),
    )
    view.update_comparison()
    assert view.fork is not None and view.fork.index == 3
    view.select("a", 0)
    assert view.near_ties() == (1,) and view.next_tie() == 1
    view.select("a", 1)
    assert view.next_tie() is None
    assert "before the fork (token 3)" in view.no_tie_note("after")
    view.select("a", 5)
    assert view.previous_tie() == 1
    assert view.stats_parts("a", presets()["ubatch"], None)[-1] == "1 near tie"


def test_the_arrows_stop_at_either_end_and_start_from_the_near_end() -> None:
    view = view_of(steps("a", [1, 2, 3]), steps("b", [1, 2, 3]))
    # without a cursor → counts from the start, ← from past the end
    assert view.moved(1) == 1 and view.moved(-1) == 2
    view.select("a", 2)
    assert view.moved(5) == 2
    view.select("a", 0)
    assert view.moved(-1) == 0
    assert view_of([], []).moved(1) is None


def test_switching_lane_keeps_the_index_where_the_other_lane_has_it() -> None:
    view = view_of(steps("a", [1, 2, 3, 4]), steps("b", [1, 2]))
    view.select("a", 3)
    assert view.switched() == ("b", 1)
    view.select("a", 1)
    assert view.switched() == ("b", 1)
    empty = view_of(steps("a", [1]), [])
    empty.select("a", 0)
    assert empty.switched() == ("b", None)


def test_stepping_back_over_the_fork_forgets_it() -> None:
    view = view_of(steps("a", [1, 2, 3]), steps("b", [1, 9, 3]))
    view.update_comparison()
    assert view.fork is not None and view.fork.index == 1
    view.forget_last("b", 2)  # after the fork: the fork stays
    assert view.fork is not None and len(view.lanes["b"].steps) == 2
    view.forget_last("b", 1)
    assert view.fork is None and view.similarity is None
    assert view.changed == {"a": set(), "b": set()}
    assert [step.token_id for step in view.lanes["b"].steps] == [1]


def test_a_reset_keeping_speeds_empties_the_lanes_but_not_their_rates() -> None:
    view = view_of(steps("a", [1]), steps("b", [1]))
    view.lanes["a"].speed = 12.5
    view.reset_keeping_speeds()
    assert view.lanes["a"].speed == 12.5 and not view.lanes["a"].steps


def test_the_stats_line_says_who_stopped_the_run_and_grades_first() -> None:
    pair = presets()["ubatch"]
    view = view_of(steps("a", [1, 2], [0.1, 1.0]), [])
    view.lanes["a"].speed = 20.0
    view.stopped_by = "a"
    view.lanes["a"].error = "model file not found"
    assert view.stats_parts("a", pair, None) == ["ERROR", "2 tokens", "20.0 tok/s", "1 near tie"]
    assert view.stats_parts("b", pair, None) == [
        "stopped: lane a failed",
        "0 tokens",
        "0 near ties",
    ]
    graded = view.stats_parts("a", pair, (True, "all tests pass"))
    assert graded[1] == "PASS" and graded[-1] == "graded: all tests pass"


def test_a_fitted_line_keeps_whole_parts_only() -> None:
    parts = ["12 tokens", "40.1 tok/s", "3 near ties"]
    assert fitted(parts, 80) == "12 tokens · 40.1 tok/s · 3 near ties"
    assert fitted(parts, 24) == "12 tokens · 40.1 tok/s"
    assert fitted(parts, 3) == "12 tokens"  # the first part even where it does not fit


def test_a_failure_keeps_its_type_and_carries_its_lane_across_a_process() -> None:
    with pytest.raises(ModelError) as raised, lane_failure("b"):
        raise ModelError("model file not found: /m/lane a.gguf")
    copied = pickle.loads(pickle.dumps(raised.value))
    assert type(copied) is ModelError and copied.lane == "b"
    assert str(copied) == "model file not found: /m/lane a.gguf"


def test_a_failure_that_names_its_lane_keeps_it() -> None:
    error = SpecdiffError("lane a: the prompt overflows n_ctx")
    error.lane = "a"
    with pytest.raises(SpecdiffError) as raised, lane_failure("b"):
        raise error
    assert raised.value.lane == "a"
    assert SpecdiffError("the prompt is empty").lane is None


def test_live_numbers_are_a_typed_record() -> None:
    live = LiveStats(31.5, drafted=10, accepted=7)
    assert (live.tokens_per_second, live.drafted, live.accepted) == (31.5, 10, 7)
    assert pickle.loads(pickle.dumps(live)) == live
