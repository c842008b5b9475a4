"""How many tokens the speculative lane drafts: the fixed rule and the adaptive one."""

from __future__ import annotations

import pytest

from specdiff.engine.llama.drafts import (
    DraftLength,
    NgramDrafter,
    expected_tokens,
    verify_cost,
)


@pytest.mark.parametrize(("room", "drafts"), [(0, 0), (1, 1), (2, 2), (3, 3), (6, 3), (7, 7)])
def test_fixed_lengths_round_widths_down_to_the_alignment(room: int, drafts: int) -> None:
    length = DraftLength(7, adaptive=False, align=4)
    assert length.wanted(room) == drafts
    length.feedback(drafts, 0)  # a fixed length does not move
    assert length.wanted(room) == drafts


def test_expected_tokens_sums_the_accepted_run_and_the_target_token() -> None:
    assert expected_tokens(3, 1.0) == 4
    assert expected_tokens(0, 0.3) == pytest.approx(1.0)
    assert expected_tokens(2, 0.5) == pytest.approx(1 + 0.5 + 0.25)


def test_a_verify_batch_costs_more_than_a_step_and_less_per_row() -> None:
    assert verify_cost(1) == 1.0
    costs = [verify_cost(w) for w in (2, 4, 8, 16)]
    assert costs == sorted(costs) and costs[0] > 1.0
    assert all(verify_cost(w) / w < verify_cost(1) for w in (4, 8, 16))


def test_adaptive_drafts_the_most_while_drafts_are_accepted() -> None:
    length = DraftLength(15, adaptive=True, align=4)
    for _ in range(10):
        length.feedback(15, 15)
    assert length.wanted(64) == 15
    assert length.wanted(64, available=9) == 7  # the widest aligned width that fits
    assert length.wanted(2) in (0, 2)  # below the alignment: any width, if it pays


def test_adaptive_stops_after_rejections_and_resumes_when_proposals_come_true() -> None:
    length = DraftLength(7, adaptive=True, align=4)
    assert length.wanted(64) > 0  # drafts from the start
    for _ in range(3):
        length.feedback(7, 0)
    assert length.wanted(64) == 0
    for position in range(10):
        length.hold_back(position, 5)
        length.check_held([5] * (position + 1))  # the target emitted what was proposed
    assert length.wanted(64) == 7


def test_a_held_back_proposal_is_scored_only_once_the_history_reaches_it() -> None:
    length = DraftLength(7, adaptive=True, align=4)
    before = length.rate
    length.hold_back(3, 9)
    length.check_held([1, 2, 3])  # position 3 not there yet: dropped, not scored
    assert length.rate == before
    length.hold_back(3, 9)
    length.check_held([1, 2, 3, 4])
    assert length.rate < before


def test_ngram_drafter_stops_on_a_pattern_the_target_breaks() -> None:
    """A history that repeats `1 2 3 x` with a new x each time: the drafter's proposal
    after `1 2 3` is always wrong, so after a few rejections it proposes nothing."""
    drafter = NgramDrafter(3, 2, drafts=7, adaptive=True, align=4)
    history = [1, 2, 3, 100]
    proposals = []
    for fresh in range(101, 121):
        history += [1, 2, 3]
        drafts = drafter.propose(history, 64)
        proposals.append(drafts)
        if drafts:
            drafter.feedback(len(drafts), 0)  # the target emits `fresh`, not the draft
        history.append(fresh)
    assert proposals[0]
    assert not any(proposals[-5:])


def test_ngram_drafter_drafts_a_copy_in_full() -> None:
    text = list(range(10, 110))
    drafter = NgramDrafter(3, 2, drafts=15, adaptive=True, align=4)
    history = [*text, *text[:3]]
    for _ in range(3):
        drafts = drafter.propose(history, 64)
        assert drafts == text[len(history) - len(text) :][: len(drafts)]
        drafter.feedback(len(drafts), len(drafts))
        history += drafts + [text[len(history) - len(text) + len(drafts)]]
    assert len(drafter.propose(history, 64)) == 15
