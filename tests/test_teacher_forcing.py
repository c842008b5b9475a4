"""Teacher forcing: lane B fed lane A's tokens, on the real model."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from specdiff.engine.llama.lane import LocalLane
from specdiff.engine.pairrun import PairRun
from specdiff.lanes import Lane, presets
from specdiff.prompts import DEFAULT_PROMPT
from tests.conftest import ForkingPrompt

pytestmark = pytest.mark.model


def test_the_first_flip_is_the_free_running_fork(
    forking_prompt: Callable[[str, int], ForkingPrompt],
) -> None:
    # Up to the fork both lanes saw the same text, so fed A's tokens, B's argmax first
    # differs from A's pick exactly where the free-running lanes forked.
    prompt = forking_prompt("ubatch", 60).prompt
    with PairRun(presets()["ubatch"]) as runner:
        free = runner.run(prompt, 60)
        forced = runner.run(prompt, 60, teacher_forced=True)
    assert free.comparison.fork is not None
    a, b = forced.a.steps, forced.b.steps
    assert forced.teacher_forced and [s.token_id for s in b] == [s.token_id for s in a]
    assert [s.token_id for s in a] == free.a.token_ids  # lane A runs as it always does
    flips = [i for i, step in enumerate(b) if step.top[0].token_id != a[i].token_id]
    assert flips and flips[0] == free.comparison.fork.index
    fork_step = b[flips[0]]
    assert fork_step.top[0].token_id == free.b.steps[flips[0]].token_id


def test_a_forced_token_outside_the_top_k_comes_with_its_logit_and_rank() -> None:
    local = LocalLane(Lane(top_k=4), "b")
    try:
        prompt = local.tokenize(DEFAULT_PROMPT)
        own = [step.token_id for step in local.generate(prompt, 6)]
        forced = [*own[:2], 107, 9, *own[2:4]]  # two unlikely tokens in the middle
        steps = list(local.generate(prompt, 10, forced=forced))
        assert [s.token_id for s in steps] == forced  # stops where `forced` ends
        assert [s.top[0].token_id for s in steps[:2]] == own[:2]
        for step in steps:
            ids = [c.token_id for c in step.top]
            if step.token_id in ids:
                assert step.probes == ()
            else:
                (probe,) = step.probes
                assert probe.token_id == step.token_id and probe.rank > 4
                assert probe.logit < step.top[-1].logit
        assert any(step.probes for step in steps)
        assert np.isfinite([s.top[0].logit for s in steps]).all()
    finally:
        local.close()
