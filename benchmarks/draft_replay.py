"""Draft policies replayed away from the clock: how fast would each drafter make greedy
decoding, given what a verify of each width costs on this machine?

First the greedy texts of the bundled sets (the plain lane's tokens, which the
speculative lane reproduces), and the time of one decode call of each width with logits
on every row (the fastest of several, the widths taken in turn). Then each drafter is
replayed over every text: it proposes from the history, the text says how many of its
drafts the target would accept, and each verify is charged the measured cost of its
width. The speedup of a text is its token count at the one-row cost over what the replay
spent. Drafters: specdiff's own (`NgramDrafter` with the lane's defaults), and llama-
server's ngram-simple and ngram-mod as their sources in llama.cpp's common/ read (with
their default sizes), so that the policies are compared on the same texts and the same
costs, without a busy moment deciding. spec_speedup.py measures the real thing; this
says how much of a difference there is the drafting policy's.

    python benchmarks/draft_replay.py [--tokens 200] [--sets repetitive open]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import prompts  # noqa: E402

from specdiff.engine.llama.drafts import Drafter, NgramDrafter  # noqa: E402
from specdiff.engine.pairrun import PairRun  # noqa: E402
from specdiff.lanes import Lane, presets  # noqa: E402

WIDTHS = (1, 2, 3, 4, 5, 6, 8, 12, 16, 20, 24, 32, 48, 64)


class NgramSimple:
    """ngram-simple as read: the latest earlier occurrence of the last `n` tokens, and
    the `m` tokens after it (at most), once the history is longer than n + m + 1."""

    def __init__(self, n: int = 12, m: int = 48) -> None:
        self.n, self.m = n, m

    def reset(self) -> None:
        return None

    def propose(self, history: Sequence[int], room: int) -> list[int]:
        n = self.n
        if len(history) <= n + self.m + 1:  # its own precondition: too short to search
            return []
        key = list(history[-n:])
        for start in range(len(history) - n - 1, -1, -1):
            if list(history[start : start + n]) == key:
                return list(history[start + n : start + n + min(self.m, room)])
        return []

    def feedback(self, proposed: int, accepted: int) -> None:
        return None

    def close(self) -> None:
        return None


class NgramMod:
    """ngram-mod as read: a table from each `n`-token window to the token after it,
    refreshed every 32 tokens; a draft chains lookups and is kept only if it reaches
    `shortest` tokens."""

    def __init__(self, n: int = 24, shortest: int = 48, longest: int = 64) -> None:
        self.n, self.shortest, self.longest = n, shortest, longest
        self.reset()

    def reset(self) -> None:
        self.table: dict[tuple[int, ...], int] = {}
        self.indexed = -1

    def _index(self, history: Sequence[int]) -> None:
        for start in range(max(self.indexed, 0), len(history) - self.n):
            self.table[tuple(history[start : start + self.n])] = history[start + self.n]
        self.indexed = len(history) - self.n

    def propose(self, history: Sequence[int], room: int) -> list[int]:
        if len(history) < self.n:
            return []
        if self.indexed < 0 or self.indexed + 32 < len(history):
            self._index(history)
        window = list(history[-self.n :])
        drafts: list[int] = []
        for _ in range(min(self.longest, room)):
            token = self.table.get(tuple(window[-self.n :]))
            if token is None:
                return drafts if len(drafts) >= self.shortest else []
            window.append(token)
            drafts.append(token)
        return drafts

    def feedback(self, proposed: int, accepted: int) -> None:
        return None

    def close(self) -> None:
        return None


def greedy_texts(
    runner: PairRun, sets: list[str], tokens: int
) -> dict[str, list[tuple[list[int], list[int]]]]:
    """Each set's (prompt tokens, plain lane's tokens) per prompt."""
    texts: dict[str, list[tuple[list[int], list[int]]]] = {}
    for name in sets:
        texts[name] = []
        for text in prompts(name):
            result = runner.run(text, tokens)
            texts[name].append((result.prompt_tokens, [s.token_id for s in result.b.steps]))
    return texts


def verify_costs(runner: PairRun, history: list[int], rounds: int = 9) -> dict[int, float]:
    """Milliseconds of one decode call of each width (logits on every row) after 150
    tokens of `history`: the fastest of `rounds`, the widths taken in turn within each
    round, so a busy moment falls on one measurement of each alike and the fastest is
    the least disturbed."""
    context = runner.lanes["a"].context  # type: ignore[attr-defined]
    base = 150
    costs = dict.fromkeys(WIDTHS, float("inf"))
    for _ in range(rounds):
        for width in WIDTHS:
            context.clear()
            context.decode_chunks(history[:base], 0)
            began = time.perf_counter()
            context.decode(history[base : base + width], base, all_logits=width > 1)
            costs[width] = min(costs[width], (time.perf_counter() - began) * 1000)
    return costs


def cost_of(costs: dict[int, float], width: int) -> float:
    """A width's cost, between measured widths on the line joining them, past the last
    in proportion to it."""
    if width in costs:
        return costs[width]
    known = sorted(costs)
    if width > known[-1]:
        return costs[known[-1]] * width / known[-1]
    below = max(w for w in known if w < width)
    above = min(w for w in known if w > width)
    return costs[below] + (costs[above] - costs[below]) * (width - below) / (above - below)


def replay(
    drafter: Drafter, prompt: list[int], tokens: list[int], costs: dict[int, float]
) -> float:
    """The speedup `drafter` would give on this text."""
    drafter.reset()
    history, emitted, spent = list(prompt), 0, 0.0
    while emitted < len(tokens):
        room = len(tokens) - emitted - 1
        drafts = drafter.propose(history, room) if room > 0 else []
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == tokens[emitted + accepted]:
            accepted += 1
        if drafts:
            drafter.feedback(len(drafts), accepted)
        spent += cost_of(costs, 1 + len(drafts))
        history.extend(tokens[emitted : emitted + accepted + 1])
        emitted += accepted + 1
    return len(tokens) * costs[1] / spent


def drafters(lane: Lane) -> dict[str, Callable[[], Drafter]]:
    def specdiff() -> Drafter:
        return NgramDrafter(
            lane.spec_ngram, lane.spec_ngram_min, lane.spec_drafts, lane.spec_adaptive,
            lane.spec_align,
        )  # fmt: skip

    return {"specdiff": specdiff, "ngram-simple": NgramSimple, "ngram-mod": NgramMod}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--sets", nargs="+", default=["repetitive", "open"])
    args = parser.parse_args()
    pair = presets()["spec-vs-plain"]
    with PairRun(pair) as runner:
        texts = greedy_texts(runner, args.sets, args.tokens)
        first_prompt, first_tokens = texts[args.sets[0]][0]
        costs = verify_costs(runner, first_prompt + first_tokens)
    print("verify cost, ms by width: " + ", ".join(f"{w} {c:.1f}" for w, c in costs.items()))
    for name in args.sets:
        print(f"{name}: {len(texts[name])} texts x up to {args.tokens} tokens")
        for label, make in drafters(pair.a).items():
            speedups = [replay(make(), prompt, tokens, costs) for prompt, tokens in texts[name]]
            each = " ".join(f"{s:.2f}" for s in speedups)
            print(f"  {label:<13} median x{statistics.median(speedups):.2f}  ({each})")


if __name__ == "__main__":
    main()
