"""Prompt-length sweeps (`suite --prompt-lengths`): every prompt padded to each given
token length, as SGLang's prefix-length determinism test does, and run as a variant of
its own, so the fork rate can be read against the length of the prompt.

A prompt is padded by prepending whole words of FILLER (repeated as needed) and a blank
line: the longest such prefix whose padded prompt still tokenizes to at most the length.
The filler is fixed text, so the padded prompts are the same on every run and machine
with the same tokenizer. A prompt already longer than a length is skipped at that length.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from specdiff.lanes import Pair
from specdiff.suite import SuiteError
from specdiff.suite.prompts import SuitePrompt

FILLER = (
    "The survey team walked the river from its source to the sea, noting each bridge, "
    "each mill and each ford, and wrote down the width of the water at every mile. "
)
"""Plain prose that asks nothing, so the prompt after it reads as the question."""
SEPARATOR = "\n\n"
LABEL_SUFFIX = "tok"
"""A length variant's label: `pair@512tok`."""
TOO_LONG = "longer than"
"""How a skipped prompt's entry reads, so the report can count them per length."""

Tokenize = Callable[[str], Sequence[int]]


def parse_prompt_lengths(value: str) -> tuple[int, ...]:
    """`128,512` -> (128, 512), in the order given; SuiteError for an empty list, a
    value that is no whole number, one below 1, or one given twice."""
    parts = [part.strip() for part in value.split(",")]
    if not any(parts):
        raise SuiteError("--prompt-lengths needs at least one token length, e.g. 128,512")
    lengths: list[int] = []
    for part in parts:
        if not part.isdigit():
            raise SuiteError(
                f"--prompt-lengths: {part!r} is not a whole number of tokens; give e.g. 128,512"
            )
        length = int(part)
        if length < 1:
            raise SuiteError(f"--prompt-lengths: {length} is below 1 token; give lengths >= 1")
        if length in lengths:
            raise SuiteError(f"--prompt-lengths: {length} is given twice; give each length once")
        lengths.append(length)
    return tuple(lengths)


def check_room(lengths: Sequence[int], pairs: Sequence[Pair], max_tokens: int) -> None:
    """Refuse a length that leaves a lane no room for --max-tokens in its context."""
    for pair in pairs:
        for lane_id, lane in (("a", pair.a), ("b", pair.b)):
            room = lane.n_ctx - max_tokens
            too_long = [length for length in lengths if length > room]
            if too_long:
                raise SuiteError(
                    f"--prompt-lengths: {too_long[0]} tokens and --max-tokens {max_tokens} "
                    f"exceed lane {lane_id}'s n_ctx {lane.n_ctx} in pair {pair.name}; give "
                    f"lengths up to {room}, or a larger n_ctx"
                )


def length_label(label: str, length: int) -> str:
    return f"{label}@{length}{LABEL_SUFFIX}"


def padded_prompt(prompt: SuitePrompt, length: int, tokenize: Tokenize) -> SuitePrompt | None:
    """The prompt with filler words before it, as many as keep it within `length`
    tokens; None when the prompt alone is longer."""
    if len(tokenize(prompt.prompt)) > length:
        return None
    words = FILLER.split()

    def text(count: int) -> str:
        filler = " ".join(words[i % len(words)] for i in range(count))
        return f"{filler}{SEPARATOR}{prompt.prompt}" if count else prompt.prompt

    # a word is at least one token, so `length` words is past the end: bisect below it
    low, high = 0, length
    while low < high:
        middle = (low + high + 1) // 2
        if len(tokenize(text(middle))) <= length:
            low = middle
        else:
            high = middle - 1
    return replace(prompt, prompt=text(low))


def skipped_message(length: int, tokens: int) -> str:
    return f"the prompt is {tokens} tokens, {TOO_LONG} --prompt-lengths {length}"
