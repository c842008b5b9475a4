from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from specdiff.compare import align_after, compare, first_divergence, fork_at, near_ties
from specdiff.steps import Candidate, Probe, TokenStep


def make_step(
    lane: str,
    index: int,
    token: int,
    top: list[tuple[int, float]] | None = None,
    probes: tuple[Probe, ...] = (),
) -> TokenStep:
    top = top or [(token, 10.0), (token + 1, 9.0)]
    return TokenStep(
        lane=lane,
        index=index,
        token_id=token,
        piece=f"<{token}>".encode(),
        top=tuple(Candidate(t, v) for t, v in top),
        drafted=False,
        verify_width=1,
        timestamp=0.0,
        probes=probes,
    )


def lane(lane_id: str, tokens: list[int], margins: list[float] | None = None) -> list[TokenStep]:
    margins = margins or [1.0] * len(tokens)
    return [
        make_step(lane_id, i, t, [(t, 10.0), (t + 1, 10.0 - m)])
        for i, (t, m) in enumerate(zip(tokens, margins))
    ]


tokens = st.lists(st.integers(0, 5), max_size=40)


@given(tokens, tokens)
def test_first_divergence_is_the_first_differing_index(a: list[int], b: list[int]) -> None:
    index = first_divergence(lane("a", a), lane("b", b))
    if index is None:
        shorter = min(len(a), len(b))
        assert a[:shorter] == b[:shorter]
    else:
        assert a[:index] == b[:index]
        assert a[index] != b[index]
    assert index == first_divergence(lane("b", b), lane("a", a))


@given(tokens, tokens)
def test_identical_means_same_ids_and_length(a: list[int], b: list[int]) -> None:
    assert compare(lane("a", a), lane("b", b)).identical == (a == b)


@given(st.lists(st.floats(0, 3), max_size=40), st.floats(0.01, 2), st.integers(0, 45))
def test_near_ties_are_exactly_the_small_margins(
    margins: list[float], threshold: float, before: int
) -> None:
    steps = lane("a", [1] * len(margins), margins)
    found = near_ties(steps, threshold, before)
    expected = tuple(i for i, s in enumerate(steps) if s.margin < threshold and i < before)
    assert found == expected


@given(tokens, tokens)
def test_alignment_similarity_bounds_and_identity(a: list[int], b: list[int]) -> None:
    steps_a, steps_b = lane("a", a), lane("b", b)
    alignment = align_after(steps_a, steps_b, 0)
    assert 0.0 <= alignment.similarity <= 1.0
    assert align_after(steps_a, steps_a, 0).similarity == 1.0
    # the opcodes rebuild lane B's tokens from lane A's
    rebuilt: list[int] = []
    for tag, a0, a1, b0, b1 in alignment.opcodes:
        rebuilt.extend(a[a0:a1] if tag == "equal" else b[b0:b1] if tag != "delete" else [])
    assert rebuilt == b


def test_fork_record_reads_both_lanes_views() -> None:
    a = [make_step("a", 0, 5), make_step("a", 1, 7, [(7, 12.0), (9, 11.9), (3, 11.0)])]
    b = [make_step("b", 0, 5), make_step("b", 1, 9, [(9, 12.2), (7, 12.15)])]
    fork = fork_at(a, b)
    assert fork is not None
    assert (fork.index, fork.token_a, fork.token_b) == (1, 7, 9)
    assert fork.a.own.rank == 1 and fork.a.other.rank == 2
    assert abs(fork.a.margin - 0.1) < 1e-9
    assert fork.b.other.logit == 12.15 and abs(fork.b.margin - 0.05) < 1e-6


def test_fork_uses_probes_outside_top_k() -> None:
    a = [make_step("a", 0, 7, [(7, 12.0), (3, 11.0)], probes=(Probe(9, 4.5, 40),))]
    b = [make_step("b", 0, 9, [(9, 12.0), (7, 11.5)])]
    fork = fork_at(a, b)
    assert fork is not None
    assert (fork.a.other.logit, fork.a.other.rank) == (4.5, 40)
    no_probe = fork_at([make_step("a", 0, 7, [(7, 12.0), (3, 11.0)])], b)
    assert no_probe is not None and no_probe.a.other.rank is None


def test_near_ties_counted_only_before_the_fork() -> None:
    a = lane("a", [1, 2, 3, 4], [0.1, 1.0, 0.2, 0.1])
    b = lane("b", [1, 2, 5, 4], [0.1, 1.0, 0.3, 0.1])
    result = compare(a, b, threshold=0.5)
    assert result.fork is not None and result.fork.index == 2
    assert result.near_ties_a == (0,)
    assert not result.identical


def test_cut_short_lane_is_not_identical() -> None:
    result = compare(lane("a", [1, 2, 3]), lane("b", [1, 2]))
    assert result.fork is None and not result.identical
