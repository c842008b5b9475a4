"""The Autopsy record: everything `specdiff explain` found for one prompt and pair,
the cause in one plain sentence, and its JSON (`Autopsy.from_json` checks every field).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from specdiff.autopsy.codec import (
    MAX_TEXT,
    growth_from,
    margin_from,
    margin_json,
    pair_of,
    tensor_from,
    tensor_json,
    trial_from,
    trial_json,
)
from specdiff.autopsy.records import (
    LAST_BITS,
    MAX_TENSORS,
    MAX_TRIALS,
    SCHEMA,
    AutopsyError,
    ForkMargin,
    LayerGrowth,
    SettingTrial,
    TensorDifference,
)
from specdiff.autopsy.words import (
    DATA_MOVES,
    KV_HISTORY,
    KV_HISTORY_LEGEND,
    draft_verdict,
    kv_history,
    made_before,
    op_meaning,
    op_words,
    percent,
    relative_speed,
    tensor_words,
)
from specdiff.file_values import MAX_TOKENS, BadValue, Fields
from specdiff.json_numbers import finite_or_null
from specdiff.lanes import Lane
from specdiff.safe_text import visible

UNNAMED_HISTORY = "by each lane's own settings"
"""Where the record does not name how the lanes computed the earlier rows."""

_ATTENTION = {
    "kq": "the attention scores (kq)",
    "kq_soft_max": "the softmax (kq_soft_max)",
    "kqv": "the weighted sum (kqv)",
    "kqv_out": "attention's output (kqv_out)",
}
"""Attention's tensors a difference in the KV cache reaches first, as the cause names them."""


def _how_far(first: TensorDifference) -> str:
    """How far apart the lanes' first differing tensor is, in words."""
    how = "in the last bits" if first.rel_l2 < LAST_BITS else f"by {first.rel_l2:.1e} of its size"
    return f"{how} (largest difference {first.max_abs:.2g})"


@dataclass(frozen=True)
class Autopsy:
    """Everything `specdiff explain` found for one prompt and pair."""

    pair: str
    max_tokens: int
    fork: int | None
    """Where the pair as given forks; None: nothing to explain."""
    trials: tuple[SettingTrial, ...] = ()
    max_runs: int = 0
    not_tried: tuple[str, ...] = ()
    """Settings left out: over the budget, or with no switch for these lanes."""
    tensors: tuple[TensorDifference, ...] = ()
    layers: tuple[LayerGrowth, ...] = ()
    margin: ForkMargin | None = None
    verify_width: tuple[int, int] = (0, 0)
    """How many tokens the decode call of the fork step held, in lane a and lane b."""
    tapping_neutral: bool = True
    """Both lanes' logits came out the same bit for bit with the taps on and off."""
    part2_note: str | None = None
    """Why the layer comparison was not made (a server lane, a failure)."""
    seconds: float = 0.0
    notes: tuple[str, ...] = field(default=())
    kv_history: str = ""
    """How the lanes computed the rows before the fork differently, in words
    (`words.kv_history` of the pair's lanes); "" where not known."""

    # -- what it found -------------------------------------------------------------
    @property
    def nothing_to_explain(self) -> bool:
        return self.fork is None

    @property
    def first_difference(self) -> TensorDifference | None:
        return next((t for t in self.tensors if not t.identical), None)

    def removing(self) -> list[SettingTrial]:
        """The trials (other than the run as given) after which the lanes agree."""
        return [t for t in self.trials if t.scope != "as given" and t.identical]

    def growth_series(self) -> list[float]:
        """Per-layer largest difference, then the logits': a sparkline's values."""
        series = [layer.max_abs for layer in self.layers]
        if self.margin is not None:
            series.append(self.margin.logits_max_abs)
        return series

    def with_lanes(self, a: Lane, b: Lane) -> Autopsy:
        """This autopsy with what its lanes did differently before the fork named
        (`kv_history`), where the record does not name it already."""
        return self if self.kv_history else replace(self, kv_history=kv_history(a, b))

    def attention_identical(self) -> bool | None:
        """Whether every attention output (kqv_out) was bit-identical; None if none tapped."""
        attention = [t for t in self.tensors if t.name.startswith("kqv_out")]
        return all(t.identical for t in attention) if attention else None

    # -- words ---------------------------------------------------------------------
    def cause(self) -> str:
        """One plain sentence (or three) naming the setting and the first operation."""
        if self.fork is None:
            nothing = (
                f"Nothing to explain: the two lanes gave the same {self.max_tokens} tokens "
                "or fewer, token for token."
            )
            verdict = draft_verdict(self.trials)
            return f"{nothing} {verdict}" if verdict else nothing
        parts = [self._picks_sentence(), self._setting_sentence()]
        operation = self._operation_sentence()
        if operation:
            parts.append(operation)
        return " ".join(part for part in parts if part)

    def _picks_sentence(self) -> str:
        margin = self.margin
        if margin is None:
            return f"The lanes fork at token {self.fork}."
        pa, pb = margin.probability_a, margin.probability_b
        return (
            f"At token {self.fork} lane a picked {margin.piece_a} "
            f"({percent(pa[0])} against {percent(pa[1])} for {margin.piece_b}) and lane b "
            f"picked {margin.piece_b} ({percent(pb[1])} against {percent(pb[0])}); in "
            f"logits (the model's raw scores, before they become probabilities) lane a's "
            f"lead was {margin.margin:.3f}."
        )

    def _setting_sentence(self) -> str:
        verdict = draft_verdict(self.trials)
        if verdict is not None:
            return verdict
        removing = self.removing()
        kernels = [t for t in removing if t.scope == "both lanes"]
        baseline = next((t for t in self.trials if t.scope == "as given"), None)
        if kernels:
            named = "; ".join(f"{t.setting}" + relative_speed(t, baseline) for t in kernels)
            return f"The fork disappears with {named}."
        moved = [t for t in removing if t.scope == "lane b"]
        if moved:
            named = ", ".join(t.setting for t in moved)
            return (
                "No kernel switch tried removes the fork; only making the lanes' own "
                f"difference the same does ({named})."
            )
        tried = len([t for t in self.trials if t.scope != "as given"])
        if tried == 0 and any("serve-pair" in item for item in self.not_tried):
            return (
                "No setting was tried: specdiff cannot restart servers it did not start "
                "(specdiff serve-pair explain sweeps the speculative server's draft length)."
            )
        if tried == 0:
            return "No setting was tried (the run budget allowed only the run as given)."
        return f"No single setting of the {tried} tried removes the fork."

    def _operation_sentence(self) -> str:
        first = self.first_difference
        if first is None:
            if self.tensors:
                return "Every tapped tensor was identical: the fork comes from an earlier step."
            return ""
        sentence = (
            self._history_sentence(first) if first.kv_history else self._computed_sentence(first)
        )
        if self.attention_identical():
            sentence += "; attention stays identical"
        margin = self.margin
        if margin is not None:
            relation = "more than" if margin.shift >= margin.margin else "less than"
            sentence += (
                f"; the difference grows to {margin.shift:.2f} logits between the two picks"
                f" at the fork, {relation} the {margin.margin:.2f} margin"
            )
        return sentence + "."

    def _history_sentence(self, first: TensorDifference) -> str:
        """The first difference lies in KV cache cells earlier decode calls wrote: the
        step read it, it did not compute it."""
        where = f"layer {first.layer}'s " if first.layer is not None else "the "
        sentence = (
            f"The first difference is in {where}{tensor_words(first.name)} "
            f"({visible(first.name, 60)}), {_how_far(first)}: entries written by earlier "
            "decode calls, not computed in this step; those calls computed the earlier "
            f"tokens differently ({self.kv_history or UNNAMED_HISTORY})"
        )
        reached = self._attention_reached(first)
        if reached:
            sentence += f", and the difference reaches {reached}"
        width_a, width_b = self.verify_width
        if width_a != width_b:
            sentence += f"; lane a computes this step {width_a} tokens wide and lane b {width_b}"
        return sentence

    def _attention_reached(self, first: TensorDifference) -> str:
        """Which of attention's tensors in the cache's layer differ, in words, in order."""
        words = []
        for tensor in self.tensors[self.tensors.index(first) + 1 :]:
            base = tensor.name.split(" (")[0].rsplit("-", 1)[0]
            if tensor.layer != first.layer or tensor.identical or base not in _ATTENTION:
                continue
            phrase = _ATTENTION[base]
            if phrase not in words:
                words.append(phrase)
        if len(words) < 2:
            return "".join(words)
        return ", ".join(words[:-1]) + " and " + words[-1]

    def _computed_sentence(self, first: TensorDifference) -> str:
        where = f"layer {first.layer}'s " if first.layer is not None else ""
        how = _how_far(first)
        named = f"({visible(first.name, 60)}, {visible(first.op, 30)})"
        if first.op in DATA_MOVES:
            # a copy or reshape rounds nothing: the difference was made before it
            sentence = (
                f"The first tapped tensor that differs is {where}{tensor_words(first.name)} "
                f"{named}, {how}; its last "
                f"operation only moves data, so the difference was made by "
                f"{made_before(first.name)}"
            )
        else:
            sentence = (
                f"The first operation that differs is {op_words(first.op)} of {where}"
                f"{tensor_words(first.name)} {named}, {how}"
            )
        width_a, width_b = self.verify_width
        if width_a != width_b:
            sentence += f" when lane a computes the step {width_a} tokens wide and lane b {width_b}"
        elif first.name.startswith("kqv_out"):
            # a record saved before the caches were tapped: attention's output is the
            # first place the history it read can show
            sentence += (
                f". Both lanes computed this step {width_a} token{'s' if width_a != 1 else ''} "
                "wide, so its own arithmetic matched until attention read the keys and values "
                "earlier steps left in the KV memory: those were computed differently "
                f"({self.kv_history or UNNAMED_HISTORY}), and the difference came in with them"
            )
        return sentence

    def legend(self) -> list[str]:
        """What the report's short names mean (the first tensor's operation, max |Δ|,
        rel L2, the growth line's marks), one entry each, for what the report shows."""
        first = self.first_difference
        if self.fork is None or (first is None and not self.layers):
            return []
        lines = []
        meaning = op_meaning(first.op) if first is not None else ""
        if first is not None and meaning:
            lines.append(
                f"{visible(first.op, 30)}: the operation that "
                f"{'last wrote' if first.kv_history else 'computed'} the first "
                f"differing tensor, {meaning}."
            )
        if first is not None and first.kv_history:
            lines.append(KV_HISTORY_LEGEND)
        lines.append(
            "max |Δ|: the largest difference of one number between the lanes. rel L2 "
            "(relative L2): the size of the whole difference against the size of the "
            "tensor; 1e-7 is rounding in the last bit of a 32-bit float."
        )
        series = self.growth_series()
        if series:
            lines.append(self._growth_legend(series))
        return lines

    def _growth_legend(self, series: list[float]) -> str:
        last = self.layers[-1].layer if self.layers else 0
        logits = ", then the logits" if self.margin is not None else ""
        blank = sum(1 for value in series if not value > 0)
        shown = [value for value in series if value > 0]
        scale = (
            f"; the lowest mark is {min(shown):.2g}, the highest {max(shown):.2g} (log scale)"
            if shown
            else ""
        )
        blanks = f"; a blank ({blank} here) is bit-identical" if blank else ""
        return (
            f"The growth line has one mark per value, {len(series)} in all: the output "
            f"of layers 0 to {last}{logits}{blanks}{scale}."
        )

    def panel_text(self) -> str:
        """A few short lines for a fork panel beside a sparkline of growth_series()."""
        if self.fork is None:
            return "nothing to explain: the lanes agree"
        lines = []
        removing = self.removing()
        if removing:
            lines.append("fork gone with: " + ", ".join(t.setting for t in removing[:3]))
        else:
            lines.append("no single setting removes the fork")
        first = self.first_difference
        if first is not None:
            lines.append(
                f"first differing tensor: {visible(first.name, 40)} ({visible(first.op, 20)}) "
                f"|Δ| {first.max_abs:.2g}" + (f", {KV_HISTORY}" if first.kv_history else "")
            )
        if self.margin is not None:
            lines.append(
                f"at the fork: {self.margin.shift:.3f} of a {self.margin.margin:.3f} margin "
                f"({self.margin.margin_used:.0%})"
            )
        if self.part2_note:
            lines.append(visible(self.part2_note, 120))
        return "\n".join(lines)

    # -- JSON ------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The record as JSON: `settings`, `first_difference` and `layers` lead."""
        first = self.first_difference
        return {
            "schema": SCHEMA,
            "pair": self.pair,
            "max_tokens": self.max_tokens,
            "fork": self.fork,
            "nothing_to_explain": self.nothing_to_explain,
            "cause": self.cause(),
            "settings": [trial_json(t) for t in self.trials],
            "first_difference": None if first is None else tensor_json(first),
            "layers": [
                # rel_l2 is inf where lane a's tensor is all zeros: JSON holds it as null
                {"layer": g.layer, "max_abs": g.max_abs, "rel_l2": finite_or_null(g.rel_l2)}
                for g in self.layers
            ],
            "margin": None if self.margin is None else margin_json(self.margin),
            "verify_width": list(self.verify_width),
            "tapping_neutral": self.tapping_neutral,
            "tensors": [tensor_json(t) for t in self.tensors],
            "max_runs": self.max_runs,
            "not_tried": list(self.not_tried),
            "part2_note": self.part2_note,
            "seconds": self.seconds,
            "notes": list(self.notes),
            # only where known: a file saved before it was named reads back the same
            **({"kv_history": self.kv_history} if self.kv_history else {}),
        }

    @classmethod
    def from_json(cls, data: object, where: str = "autopsy") -> Autopsy:
        """Read a record `to_json` wrote; anything else is one AutopsyError line naming
        `where` (the file it came from) and the field."""
        try:
            return cls._from_fields(Fields(data, where))
        except BadValue as error:
            raise AutopsyError(str(error)) from None

    @classmethod
    def _from_fields(cls, record: Fields) -> Autopsy:
        if record.whole("schema") != SCHEMA:
            raise AutopsyError(f"{record.where}: schema is not {SCHEMA}; re-run specdiff explain")
        margin = record.optional_record("margin")
        return cls(
            pair=record.text("pair", MAX_TEXT),
            max_tokens=record.whole("max_tokens", 0, MAX_TOKENS),
            fork=record.optional_whole("fork", 0, MAX_TOKENS),
            trials=tuple(trial_from(item) for item in record.records("settings", MAX_TRIALS)),
            max_runs=record.whole("max_runs"),
            not_tried=tuple(record.texts("not_tried", MAX_TRIALS)),
            tensors=tuple(tensor_from(item) for item in record.records("tensors", MAX_TENSORS)),
            layers=tuple(growth_from(item) for item in record.records("layers", MAX_TENSORS)),
            margin=None if margin is None else margin_from(margin),
            verify_width=pair_of(
                record.wholes("verify_width", 8, 0, MAX_TOKENS), record, "verify_width"
            ),
            tapping_neutral=record.flag("tapping_neutral"),
            part2_note=record.optional_text("part2_note", MAX_TEXT),
            seconds=record.number("seconds", low=0),
            notes=tuple(record.texts("notes", MAX_TRIALS)),
            # newer than the first saved autopsies: a file without it reads as ""
            kv_history=record.text("kv_history", MAX_TEXT) if "kv_history" in record.data else "",
        )
