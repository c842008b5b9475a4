"""A fork's autopsy: which setting, which layer and which operation made two lanes part.

These are the records `specdiff explain` produces and every front end reads: the
settings sweep (one SettingTrial per run), the tensors compared at the fork step (one
TensorDifference each, in graph order), the difference's growth layer by layer, and
one plain-words sentence naming the cause. They hold numbers and names only, never
arrays or engine objects, so the command line, the exports and the TUI can show an
autopsy without loading llama.cpp, and a JSON file of one reads back the same
(`Autopsy.from_json` checks every field, since such a file may come from anyone).

The engine side that fills them in is `specdiff.engine.autopsy`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdiff.errors import SpecdiffError
from specdiff.files import write_text_atomic
from specdiff.json_numbers import finite_or_null
from specdiff.lanes import Pair
from specdiff.safe_text import visible

SCHEMA = 1
LAST_BITS = 1e-5
"""A relative L2 difference below this is rounding in the last bits of float32 (whose
own step is 1.2e-7 relative), not a different computation."""
MAX_TRIALS = 1000
MAX_TENSORS = 100_000
MAX_NAME = 200
DRAFT_KEY = "spec_draft_n_max"
"""The key of a trial that ran the speculative server with another draft length."""


class AutopsyError(SpecdiffError):
    """An autopsy cannot be made, or a saved one cannot be read."""


class AutopsyInterrupted(AutopsyError):
    """Ctrl+C stopped the autopsy before it had anything to report."""


@dataclass(frozen=True)
class SettingTrial:
    """One run of the pair with one setting moved: whether the lanes still fork."""

    setting: str
    """What was changed, in words: "repack off (both lanes)"."""
    key: str
    """The lane key changed ("" for the run as given)."""
    value: str
    scope: str
    """"as given", "lane b" (moved toward lane a) or "both lanes" (a kernel switch)."""
    fork: int | None
    """The first token at which the lanes differ; None when they agree throughout."""
    tokens_a: int
    tokens_b: int
    speed_a: float
    """Tokens per second after the first token."""
    speed_b: float
    error: str | None = None
    cached: bool = False
    """Read from the cache of an earlier explain of the same prompt and settings."""

    @property
    def identical(self) -> bool:
        return self.error is None and self.fork is None and self.tokens_a == self.tokens_b

    @property
    def outcome(self) -> str:
        if self.error is not None:
            return "failed"
        if self.fork is not None:
            return f"forks at {self.fork}"
        if self.tokens_a != self.tokens_b:
            return f"lengths differ ({self.tokens_a} vs {self.tokens_b})"
        return "identical"


@dataclass(frozen=True)
class TensorDifference:
    """One named tensor of the fork step, lane a's column against lane b's."""

    name: str
    layer: int | None
    """The layer the tensor belongs to; None for the input and the output head."""
    op: str
    """The ggml operation that computed it (MUL_MAT, ADD, RMS_NORM, ...)."""
    shape_a: tuple[int, ...]
    shape_b: tuple[int, ...]
    identical: bool
    """Bit for bit, raw bytes compared before any arithmetic."""
    max_abs: float
    """The largest absolute difference of one value."""
    rel_l2: float
    """|a - b| / |a| over the column (Euclidean norms)."""


@dataclass(frozen=True)
class LayerGrowth:
    """How far apart the lanes are at the output of one layer."""

    layer: int
    max_abs: float
    rel_l2: float


@dataclass(frozen=True)
class ForkMargin:
    """The two picks at the fork step, as each lane scored them."""

    token_a: int
    token_b: int
    piece_a: str
    piece_b: str
    probability_a: tuple[float, float]
    """Lane a's probabilities of (its pick, lane b's pick)."""
    probability_b: tuple[float, float]
    """Lane b's probabilities of (lane a's pick, its pick)."""
    margin: float
    """Lane a's logit of its pick minus its logit of lane b's pick."""
    shift: float
    """How much that gap moved between the lanes: lane a's gap minus lane b's. Above
    the margin, the order of the two picks flipped."""
    logits_max_abs: float
    """The largest difference of one logit between the lanes at the step."""

    @property
    def margin_used(self) -> float:
        """The share of lane a's margin the difference used up (1 or more: flipped)."""
        return self.shift / self.margin if self.margin > 0 else math.inf


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
            f"({_percent(pa[0])} against {_percent(pa[1])} for {margin.piece_b}) and lane b "
            f"picked {margin.piece_b} ({_percent(pb[1])} against {_percent(pb[0])}); in "
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
            named = "; ".join(f"{t.setting}" + _relative_speed(t, baseline) for t in kernels)
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
        where = f"layer {first.layer}'s " if first.layer is not None else ""
        how = (
            "in the last bits" if first.rel_l2 < LAST_BITS else f"by {first.rel_l2:.1e} of its size"
        )
        named = f"({visible(first.name, 60)}, {visible(first.op, 30)})"
        if first.op in DATA_MOVES:
            # a copy or reshape rounds nothing: the difference was made before it
            sentence = (
                f"The first tapped tensor that differs is {where}{tensor_words(first.name)} "
                f"{named}, {how} (largest difference {first.max_abs:.2g}); its last "
                f"operation only moves data, so the difference was made by "
                f"{_made_before(first.name)}"
            )
        else:
            sentence = (
                f"The first operation that differs is {op_words(first.op)} of {where}"
                f"{tensor_words(first.name)} {named}, {how} (largest difference "
                f"{first.max_abs:.2g})"
            )
        width_a, width_b = self.verify_width
        if width_a != width_b:
            sentence += f" when lane a computes the step {width_a} tokens wide and lane b {width_b}"
        elif first.name.startswith("kqv_out"):
            sentence += (
                f". Both lanes computed this step {width_a} token{'s' if width_a != 1 else ''} "
                "wide, so its own arithmetic matched until attention read the keys and values "
                "earlier steps left in the KV memory: those were computed differently (in "
                "wider verify batches, say), and the difference came in with them"
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
                f"|Δ| {first.max_abs:.2g}"
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
            "settings": [_trial_json(t) for t in self.trials],
            "first_difference": None if first is None else _tensor_json(first),
            "layers": [
                # rel_l2 is inf where lane a's tensor is all zeros: JSON holds it as null
                {"layer": g.layer, "max_abs": g.max_abs, "rel_l2": finite_or_null(g.rel_l2)}
                for g in self.layers
            ],
            "margin": None if self.margin is None else _margin_json(self.margin),
            "verify_width": list(self.verify_width),
            "tapping_neutral": self.tapping_neutral,
            "tensors": [_tensor_json(t) for t in self.tensors],
            "max_runs": self.max_runs,
            "not_tried": list(self.not_tried),
            "part2_note": self.part2_note,
            "seconds": self.seconds,
            "notes": list(self.notes),
        }

    @classmethod
    def from_json(cls, data: object) -> Autopsy:
        """Read a record `to_json` wrote; anything else is one AutopsyError line."""
        record = _Reader(data, "autopsy")
        if record.integer("schema") != SCHEMA:
            raise AutopsyError(f"autopsy: schema is not {SCHEMA}; re-run specdiff explain")
        margin = record.optional("margin")
        return cls(
            pair=record.text("pair"),
            max_tokens=record.integer("max_tokens"),
            fork=record.optional_integer("fork"),
            trials=tuple(_trial_from(item) for item in record.items("settings", MAX_TRIALS)),
            max_runs=record.integer("max_runs"),
            not_tried=tuple(record.texts("not_tried")),
            tensors=tuple(_tensor_from(item) for item in record.items("tensors", MAX_TENSORS)),
            layers=tuple(
                LayerGrowth(r.integer("layer"), r.number("max_abs"), r.unbounded("rel_l2"))
                for r in record.items("layers", MAX_TENSORS)
            ),
            margin=None if margin is None else _margin_from(_Reader(margin, "margin")),
            verify_width=_pair_of(record.integers("verify_width"), "verify_width"),
            tapping_neutral=record.boolean("tapping_neutral"),
            part2_note=record.optional_text("part2_note"),
            seconds=record.number("seconds"),
            notes=tuple(record.texts("notes")),
        )


def draft_verdict(trials: Sequence[SettingTrial]) -> str | None:
    """What a sweep of the speculative server's draft length says, in one sentence;
    None when no trial ran one. A fork at the same token whatever the server drafts
    cannot come from which drafts it accepted and rolled back (that changes with the
    draft length): the verify batch's arithmetic rounded differently."""
    if not any(trial.key == DRAFT_KEY for trial in trials):
        return None
    ran = [t for t in trials if t.key == DRAFT_KEY and t.error is None]
    if len(ran) < 2:
        return (
            "Fewer than two draft lengths ran, so the sweep cannot tell a numerics fork from "
            "the accept/rollback logic; give more draft lengths or a larger --max-runs."
        )
    lengths = ", ".join(t.value for t in ran)
    forked = [t for t in ran if t.fork is not None]
    positions = sorted({t.fork for t in forked if t.fork is not None})
    if not forked:
        if all(t.identical for t in ran):
            return f"The lanes agree at every draft length tried ({lengths})."
        return (
            f"No draft length tried ({lengths}) makes the lanes pick differently; they "
            "differ only in length."
        )
    if len(forked) == len(ran) and len(positions) == 1:
        return (
            f"The fork stays at token {positions[0]} at every draft length tried ({lengths}): "
            "a numerics fork (the verify batch's arithmetic), not the accept/rollback logic."
        )
    where = "; ".join(f"{t.outcome} with draft length {t.value}" for t in ran)
    if len(forked) < len(ran):
        return (
            f"The fork disappears at some draft lengths ({where}): whether the lanes part "
            "depends on what the speculative server drafts and accepts, not on one fixed "
            "rounding difference."
        )
    return (
        f"The fork moves with the draft length ({where}): where it lands depends on what "
        "the speculative server drafts and accepts (the accept/rollback path, or the width "
        "of the batches it verifies), not on one fixed rounding difference."
    )


# -- words for graph names and ops -----------------------------------------------------

_TENSOR_WORDS = {
    "inp_embd": "the token embedding",
    "inp_scaled": "the scaled token embedding",
    "attn_norm": "attention input norm",
    "Qcur": "attention query",
    "Qcur_normed": "normalised attention query",
    "Kcur": "attention key",
    "Kcur_normed": "normalised attention key",
    "Vcur": "attention value",
    "kqv_out": "attention output",
    "attn_out": "attention output projection",
    "attn_post_norm": "attention output norm",
    "sa_out": "sum after attention",
    "ffn_inp": "feed-forward input",
    "ffn_norm": "feed-forward input norm",
    "ffn_up": "feed-forward up projection",
    "ffn_gate": "feed-forward gate projection",
    "ffn_geglu": "feed-forward gated activation",
    "ffn_swiglu": "feed-forward gated activation",
    "ffn_out": "feed-forward output",
    "ffn_post_norm": "feed-forward output norm",
    "l_out": "output",
    "result_norm": "the final norm",
    "result_output": "the output logits",
}
_OP_WORDS = {
    "MUL_MAT": "the matrix multiply",
    "ADD": "the addition",
    "MUL": "the multiplication",
    "RMS_NORM": "the RMS normalisation",
    "NORM": "the normalisation",
    "SCALE": "the scaling",
    "ROPE": "the rotary position encoding",
    "SOFT_MAX": "the softmax",
    "GET_ROWS": "the row lookup",
    "FLASH_ATTN_EXT": "flash attention",
    "GLU": "the gated activation",
    "GEGLU": "the gated activation",
    "CPY": "the copy",
    "CONT": "the copy",
}


DATA_MOVES = frozenset({"CONT", "CPY", "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE", "DUP"})
"""Operations that move values without arithmetic."""


def _made_before(name: str) -> str:
    if name.startswith("kqv_out"):
        return "the attention before it (its scores, softmax and weighted sum, not tapped)"
    return "the operation before it"


def tensor_words(name: str) -> str:
    """ "feed-forward output" for "ffn_out-0"; the name itself for one not known."""
    base = name.rsplit("-", 1)[0] if name.rsplit("-", 1)[-1].isdigit() else name
    return _TENSOR_WORDS.get(base, visible(base, 60))


def op_words(op: str) -> str:
    return _OP_WORDS.get(op, f"the {visible(op, 30)} operation")


def _percent(probability: float) -> str:
    return f"{probability:.0%}" if probability >= 0.01 else f"{probability:.1e}"


def _relative_speed(trial: SettingTrial, baseline: SettingTrial | None) -> str:
    if baseline is None or baseline.speed_a <= 0 or trial.speed_a <= 0:
        return ""
    return f" (lane a at {trial.speed_a / baseline.speed_a:.2f}x its speed)"


# -- JSON, written and read back --------------------------------------------------------


def _trial_json(trial: SettingTrial) -> dict[str, Any]:
    return {
        "setting": trial.setting,
        "key": trial.key,
        "value": trial.value,
        "scope": trial.scope,
        "identical": trial.identical,
        "outcome": trial.outcome,
        "fork": trial.fork,
        "tokens_a": trial.tokens_a,
        "tokens_b": trial.tokens_b,
        "speed_a": trial.speed_a,
        "speed_b": trial.speed_b,
        "error": trial.error,
        "cached": trial.cached,
    }


def _tensor_json(tensor: TensorDifference) -> dict[str, Any]:
    return {
        "name": tensor.name,
        "layer": tensor.layer,
        "op": tensor.op,
        "shape_a": list(tensor.shape_a),
        "shape_b": list(tensor.shape_b),
        "identical": tensor.identical,
        "max_abs": finite_or_null(tensor.max_abs),
        "rel_l2": finite_or_null(tensor.rel_l2),
    }


def _margin_json(margin: ForkMargin) -> dict[str, Any]:
    return {
        "token_a": margin.token_a,
        "token_b": margin.token_b,
        "piece_a": margin.piece_a,
        "piece_b": margin.piece_b,
        "probability_a": list(margin.probability_a),
        "probability_b": list(margin.probability_b),
        "margin": margin.margin,
        "shift": margin.shift,
        "margin_used": finite_or_null(margin.margin_used),
        "logits_max_abs": margin.logits_max_abs,
    }


class _Reader:
    """Typed reads of one JSON object, each failure naming the field."""

    def __init__(self, data: object, where: str) -> None:
        if not isinstance(data, Mapping):
            raise AutopsyError(f"{where}: expected an object, got {type(data).__name__}")
        self.data = data
        self.where = where

    def _get(self, key: str) -> object:
        if key not in self.data:
            raise AutopsyError(f"{self.where}: missing field {key!r}")
        return self.data[key]

    def _bad(self, key: str, wanted: str) -> AutopsyError:
        return AutopsyError(f"{self.where}: field {key!r} must be {wanted}")

    def text(self, key: str) -> str:
        value = self._get(key)
        if not isinstance(value, str) or len(value) > MAX_NAME * 10:
            raise self._bad(key, "text")
        return value

    def optional_text(self, key: str) -> str | None:
        return None if self._get(key) is None else self.text(key)

    def integer(self, key: str) -> int:
        value = self._get(key)
        if not isinstance(value, int) or isinstance(value, bool):
            raise self._bad(key, "a whole number")
        return value

    def optional_integer(self, key: str) -> int | None:
        return None if self._get(key) is None else self.integer(key)

    def number(self, key: str) -> float:
        value = self._get(key)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise self._bad(key, "a number")
        return float(value)

    def unbounded(self, key: str) -> float:
        """A number, or null for one JSON cannot hold (a difference beyond any scale)."""
        return math.inf if self._get(key) is None else self.number(key)

    def boolean(self, key: str) -> bool:
        value = self._get(key)
        if not isinstance(value, bool):
            raise self._bad(key, "true or false")
        return value

    def optional(self, key: str) -> object:
        return self._get(key)

    def _list(self, key: str, limit: int) -> Sequence[object]:
        value = self._get(key)
        if not isinstance(value, list) or len(value) > limit:
            raise self._bad(key, f"a list of at most {limit}")
        return value

    def items(self, key: str, limit: int) -> list[_Reader]:
        return [_Reader(item, f"{self.where}.{key}") for item in self._list(key, limit)]

    def texts(self, key: str) -> list[str]:
        values = self._list(key, MAX_TRIALS)
        if not all(isinstance(v, str) for v in values):
            raise self._bad(key, "a list of text")
        return [str(v) for v in values]

    def integers(self, key: str) -> list[int]:
        values = self._list(key, 8)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise self._bad(key, "a list of whole numbers")
        return [v for v in values if isinstance(v, int)]

    def numbers(self, key: str) -> list[float]:
        values = self._list(key, 8)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            raise self._bad(key, "a list of numbers")
        return [float(v) for v in values if isinstance(v, (int, float))]


def _pair_of(values: Sequence[Any], key: str) -> Any:
    if len(values) != 2:
        raise AutopsyError(f"autopsy: field {key!r} must hold two values")
    return values[0], values[1]


def _trial_from(record: _Reader) -> SettingTrial:
    return SettingTrial(
        setting=record.text("setting"),
        key=record.text("key"),
        value=record.text("value"),
        scope=record.text("scope"),
        fork=record.optional_integer("fork"),
        tokens_a=record.integer("tokens_a"),
        tokens_b=record.integer("tokens_b"),
        speed_a=record.number("speed_a"),
        speed_b=record.number("speed_b"),
        error=record.optional_text("error"),
        cached=record.boolean("cached"),
    )


def _tensor_from(record: _Reader) -> TensorDifference:
    return TensorDifference(
        name=record.text("name"),
        layer=record.optional_integer("layer"),
        op=record.text("op"),
        shape_a=tuple(record.integers("shape_a")),
        shape_b=tuple(record.integers("shape_b")),
        identical=record.boolean("identical"),
        max_abs=record.unbounded("max_abs"),
        rel_l2=record.unbounded("rel_l2"),
    )


def _margin_from(record: _Reader) -> ForkMargin:
    return ForkMargin(
        token_a=record.integer("token_a"),
        token_b=record.integer("token_b"),
        piece_a=record.text("piece_a"),
        piece_b=record.text("piece_b"),
        probability_a=_pair_of(record.numbers("probability_a"), "probability_a"),
        probability_b=_pair_of(record.numbers("probability_b"), "probability_b"),
        margin=record.number("margin"),
        shift=record.number("shift"),
        logits_max_abs=record.number("logits_max_abs"),
    )


# -- an autopsy saved beside its session -----------------------------------------------
SAVED_SUFFIX = ".autopsy.json"
MAX_SAVED_BYTES = 16 * 1024 * 1024


def missing_model(pair: Pair) -> tuple[str, Path] | None:
    """The first in-process lane whose own model file is gone, and that file's path:
    the autopsy re-runs both lanes, which a missing file makes impossible."""
    for lane_id, lane in (("a", pair.a), ("b", pair.b)):
        if lane.backend == "local" and lane.model != "default":
            path = Path(lane.model).expanduser()
            if not path.is_file():
                return lane_id, path
    return None


def saved_beside(session_path: Path) -> Path:
    """Where `specdiff explain SESSION --save` writes the autopsy, and where a replay of
    that session looks for it: run-1.jsonl's is run-1.autopsy.json."""
    return session_path.with_name(session_path.stem + SAVED_SUFFIX)


def save_beside(session_path: Path, autopsy: Autopsy) -> Path:
    """Write the record beside its session (atomically: a replay may be reading it)."""
    target = saved_beside(session_path)
    text = json.dumps(autopsy.to_json(), indent=1, ensure_ascii=True, allow_nan=False)
    write_text_atomic(target, text + "\n")
    return target


def load_saved(path: Path) -> Autopsy:
    """A saved record, checked field by field; anything else is one AutopsyError line."""
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_SAVED_BYTES + 1)
    except OSError as error:
        raise AutopsyError(f"{visible(path.name)}: cannot read it ({error.strerror})") from None
    if len(raw) > MAX_SAVED_BYTES:
        raise AutopsyError(f"{visible(path.name)}: over {MAX_SAVED_BYTES} bytes; not an autopsy")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise AutopsyError(
            f"{visible(path.name)}: not JSON; write it again with specdiff explain --save"
        ) from None
    return Autopsy.from_json(data)
