"""The words specdiff's output uses, each defined once, in plain words.

A newcomer meets "logit", "margin" and "near tie" in the first fork explanation they
read; the run text, `specdiff run --help`, the docs and the TUI's help all quote the
definitions here, so a term means the same thing wherever it appears. Each definition
leads with probabilities, the one scale a reader already knows, and reaches logits
only to say how they relate.
"""

from __future__ import annotations

import math
import re
import textwrap
from dataclasses import dataclass

from specdiff.compare import DEFAULT_NEAR_TIE, DEFAULT_SPLIT_THRESHOLD


@dataclass(frozen=True)
class Term:
    """One glossary entry."""

    name: str
    """The word as it appears in output ("near tie")."""
    short: str
    """A few words for a footer, under 70 characters."""
    definition: str
    """One or two plain sentences, probabilities first."""
    spellings: tuple[str, ...] = ()
    """Other forms of the word that count as using it ("logits", "near ties")."""


GLOSSARY: tuple[Term, ...] = (
    Term(
        "logit",
        "the model's raw score for a token; +1 logit = 2.7x as likely",
        "The model's raw score for a candidate token; probabilities come from these "
        "scores, and a token scored 1 logit higher than another is e = 2.7 times as likely "
        "(0.1 logit higher: 1.1 times).",
        ("logits",),
    ),
    Term(
        "margin",
        "how far the top pick's score was above the runner-up's, in logits",
        "How sure the model was at one step: its top token's logit minus the second's. "
        "A margin of 0.05 means the top two were nearly 50/50; a margin of 5 means the top "
        "token was about 150 times as likely as the next.",
        ("margins",),
    ),
    Term(
        "near tie",
        f"a step whose margin was under {DEFAULT_NEAR_TIE:g} logit: nearly a coin flip",
        f"A step where the top two tokens were almost equally likely (a margin under "
        f"{DEFAULT_NEAR_TIE:g} logit, at most {math.exp(DEFAULT_NEAR_TIE):.2f} times as likely, "
        "unless --near-tie says "
        "otherwise). A tiny rounding difference between two configurations can swap them.",
        ("near ties", "near-tie"),
    ),
    Term(
        "fork",
        "the first token at which the two lanes' texts differ",
        "The first token at which the two lanes picked different tokens; from there on "
        "their texts usually go separate ways.",
        ("forks", "forked", "diverged"),
    ),
    Term(
        "fork class",
        "near tie, ambiguous or large-margin split: how close the fork was",
        "What a fork was, read from how likely the reference lane (lane a) held the other "
        f"lane's pick: a near tie (within {DEFAULT_NEAR_TIE:g} logit of its best: rounding "
        f"explains it), a large-margin split ({DEFAULT_SPLIT_THRESHOLD:g} logits or more "
        "below, or not a candidate at all: the other lane computed something else), or "
        "ambiguous (in between).",
        ("large-margin split", "ambiguous"),
    ),
    Term(
        "acceptance",
        "the share of drafted tokens the model kept (speculative decoding)",
        "In speculative decoding a cheap drafter guesses the next few tokens and the "
        "model checks them in one batch; acceptance is the share of guesses it kept. "
        "High acceptance means more speed; it should never change the text.",
        ("accepted", "drafts", "drafted"),
    ),
    Term(
        "noise floor",
        "how far rounding alone moves a score here, in logits",
        "How far rounding alone moves a token's logit between two configurations that "
        "compute the same thing (measured by feeding both the same text); a fork with a "
        "margin below it is a rounding effect, not a different computation.",
        ("noise",),
    ),
    Term(
        "forecast",
        "the steps most likely to fork, read from one lane's margins",
        "A list of the steps most likely to fork, from one lane's margins alone: the "
        "closer a step was to a coin flip, the higher it ranks.",
        ("forecasts",),
    ),
    Term(
        "lane",
        "one decoding configuration (lane a, lane b) run on the prompt",
        "One way of running the model (speculative or plain, a cached prefix or not, a "
        "batch size, a thread count, a server); specdiff runs the same prompt in two lanes, "
        "a and b, at temperature 0 and compares their tokens.",
        ("lanes",),
    ),
    Term(
        "pair",
        "two lanes that differ in one setting, named (spec-vs-plain, threads)",
        "Two lanes that differ in one setting, under a name such as spec-vs-plain, ubatch "
        "or threads; `--pair NAME` chooses one, `--lane-a`/`--lane-b` change either lane.",
        ("pairs", "--pair"),
    ),
)

_BY_NAME = {term.name: term for term in GLOSSARY}


def term(name: str) -> Term:
    """The entry called `name`; a KeyError names a term the glossary lacks, a bug."""
    return _BY_NAME[name]


def terms_in(text: str, names: tuple[str, ...] | None = None) -> list[Term]:
    """The entries whose word (or another spelling of it) appears in `text` as a whole
    word, in glossary order; only those in `names` where given."""
    found = []
    for entry in GLOSSARY:
        if names is not None and entry.name not in names:
            continue
        words = (entry.name, *entry.spellings)
        pattern = r"(?<![\w-])(?:" + "|".join(re.escape(word) for word in words) + r")(?![\w-])"
        if re.search(pattern, text, re.IGNORECASE):
            found.append(entry)
    return found


def terms_footer(text: str, names: tuple[str, ...], width: int = 100) -> list[str]:
    """A few lines defining the terms of `names` that `text` uses, ending where the rest
    are; empty when it uses none of them."""
    used = terms_in(text, names)
    if not used:
        return []
    column = max(len(entry.name) for entry in used) + 2
    lines = ["terms (all of them: specdiff run --help):"]
    room = max(width, 40) - 1
    for entry in used:
        line = f"  {entry.name:<{column}}{entry.short}"
        lines.append(line if len(line) <= room else line[: room - 1] + "…")
    return lines


def glossary_text(width: int = 78) -> str:
    """Every entry as an indented paragraph, for --help and the docs."""
    lines = []
    for entry in GLOSSARY:
        lines.append(entry.name)
        lines.extend(
            textwrap.wrap(entry.definition, width, initial_indent="  ", subsequent_indent="  ")
        )
    return "\n".join(lines)
