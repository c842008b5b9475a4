"""What an imported run is: the items one evaluation tool answered and graded, each
keyed so that the same item of another run of the same evaluation can be found."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from specdiff.errors import SpecdiffError


class ImportInputError(SpecdiffError):
    """A file that is not the tool's output, or two runs that cannot be paired."""


@dataclass(frozen=True)
class ImportedItem:
    """One item of an imported run: its prompt, the text the model gave, its grades."""

    group: str
    """Where the item belongs: an lm-eval task, a promptfoo provider."""
    item_id: str
    """The item within its group: lm-eval's doc_id, promptfoo's test and prompt index."""
    prompt: str
    output: str
    """The model's raw answer (lm-eval's `resps`, promptfoo's `response.output`), as text:
    answers that are not text (log-likelihoods) as their JSON."""
    grades: Mapping[str, float]
    """Metric name to value: 1.0 / 0.0 for pass / fail."""
    prompt_hash: str | None = None
    """The tool's hash of the prompt, where it writes one: two runs that gave the same
    item id different prompts are not the same evaluation."""

    @property
    def key(self) -> tuple[str, str]:
        return self.group, self.item_id


@dataclass(frozen=True)
class ImportedRun:
    """Every item of one run of an evaluation tool, in the order the tool wrote them."""

    tool: str
    source: str
    """The path it was read from, as given."""
    items: tuple[ImportedItem, ...]
    higher_is_better: Mapping[str, bool]
    """Metric name to whether a higher value is better, where the run says so; a metric
    absent here is taken as higher-is-better."""
    notes: tuple[str, ...] = ()
    """What the reader chose on the user's behalf (the newest of two samples files)."""
