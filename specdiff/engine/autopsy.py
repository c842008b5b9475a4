"""The fork autopsy's engine side: the settings sweep, and the tensors compared at the
fork step.

Part 1 (which setting) runs the pair again with one setting moved at a time, through
PairRun, the same lockstep runner `specdiff run` uses, so a trial's fork is the fork
`run` would show. Two kinds of move: each key in which the lanes differ, set in lane b
to lane a's value (does the lanes' own difference explain the fork?), and the kernel
switches llama.cpp has at run time, set in *both* lanes (does a kernel explain it?).
Toggling a kernel in one lane only would add a difference rather than remove one. The
runs are bounded by a budget, each stops at its fork (its answer), each outcome is
cached under the prompt, the lanes and the build, so a second explain of the same fork
runs only what is new, and the progress says about how long the rest will take.

Part 2 (which layer and operation) replays each lane to the fork step with tensor taps
(`specdiff.engine.llama.taps`) and compares the two lanes' columns tensor by tensor in
graph order: raw bytes first (bit-identical or not), then the largest difference and
the relative L2. It needs both lanes in-process: a server offers no eval callback, so
for server lanes only part 1 runs, one trial at a time (`server_trial`), while the
command restarts the speculative server with each draft length between them.

This module holds arrays and llama.cpp objects; what it returns is the plain record in
`specdiff.autopsy`.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from specdiff import __version__
from specdiff.autopsy import (
    Autopsy,
    AutopsyError,
    AutopsyInterrupted,
    AutopsyStage,
    ForkMargin,
    LayerGrowth,
    SettingTrial,
    TensorDifference,
)
from specdiff.engine.base import Cancelled
from specdiff.engine.llama.context import ModelPool
from specdiff.engine.llama.taps import StepTaps, TappedTensor, split_name, tap_step
from specdiff.engine.pairrun import PairRun
from specdiff.engine.runtime import build_info
from specdiff.errors import SpecdiffError
from specdiff.files import write_text_atomic
from specdiff.lanes import Lane, LaneId, Pair, differences
from specdiff.results import LaneOutcome, PairResult
from specdiff.safe_text import visible

Progress = Callable[[AutopsyStage], None]

SERVER_PART2 = (
    "explain needs both lanes in-process: it traces layers with llama.cpp's eval "
    "callback, which a server does not offer over HTTP; run the lane with backend=local "
    "(e.g. --lane-a backend=local)"
)
SERVER_PART2_NOTE = (
    "part 2 (which layer and operation) needs both lanes in-process: it taps llama.cpp's "
    "eval callback, which a server does not offer over HTTP (run the lanes with "
    "backend=local for it)"
)
UNTRACED_KEYS = ("label",)


def _quiet(_: AutopsyStage) -> None:
    return None


@dataclass(frozen=True)
class Move:
    """One setting moved for one trial."""

    setting: str
    key: str
    value: str
    scope: str
    pair: Pair | None
    """None when the moved lanes are not valid lanes (`error` says why)."""
    error: str | None = None


TOGETHER = (("n_batch", "n_ubatch"), ("type_k", "type_v"), ("threads", "threads_batch"))
"""Keys moved as one where both differ: one alone may make no valid lane (n_ubatch
above n_batch), and a reader thinks of them as one setting."""


def refuse_servers(pair: Pair) -> None:
    """The one line for a pair with a server lane (before anything runs)."""
    if pair.a.backend == "server" or pair.b.backend == "server":
        raise AutopsyError(SERVER_PART2)


def plan_moves(pair: Pair) -> list[Move]:
    """Every trial for this pair, the lanes' own differences first, then the kernel
    switches in the order they most often matter on a CPU (repacked kernels, batch
    width, attention kernel, threads, KV precision, draft length, GPU offload)."""
    a, b = pair.a, pair.b
    moves: list[Move] = []
    differing = [key for key in differences(a, b) if key not in UNTRACED_KEYS]
    done: set[str] = set()
    for key in differing:
        if key in done:
            continue
        group = next((g for g in TOGETHER if key in g), (key,))
        keys = [k for k in group if k in differing]
        done.update(keys)
        changes = {k: getattr(a, k) for k in keys}
        values = ", ".join(str(v) for v in changes.values())
        setting = f"lane b's {', '.join(keys)} = lane a's ({values})"
        moves.append(_move(setting, keys[0], values, "lane b", pair, None, changes))

    def both(setting: str, changes: dict[str, Any]) -> None:
        key = next(iter(changes))
        moves.append(_move(setting, key, str(changes[key]), "both lanes", pair, changes, changes))

    repack = "off" if a.repack in ("auto", "on") else "on"
    both(f"repack {repack}", {"repack": repack})
    if a.n_ubatch != 1 or b.n_ubatch != 1:
        both("n_ubatch 1 (every row computed alone)", {"n_ubatch": 1})
    flash = "on" if a.flash_attn != "on" else "off"
    both(f"flash_attn {flash}", {"flash_attn": flash})
    threads = 1 if a.threads != 1 else 2
    both(f"threads {threads}", {"threads": threads, "threads_batch": 0})
    kv = "f32" if a.type_k != "f32" else "f16"
    both(f"KV cache {kv}", {"type_k": kv, "type_v": kv})
    if a.speculative or b.speculative:
        drafts = 3 if a.spec_drafts != 3 else 1
        both(f"draft length {drafts}", {"spec_drafts": drafts})
    if a.gpu_layers or b.gpu_layers:
        both("every layer on the CPU (no offload)", {"gpu_layers": 0})
    return moves


def _move(
    setting: str,
    key: str,
    value: str,
    scope: str,
    pair: Pair,
    changes_a: dict[str, Any] | None,
    changes_b: dict[str, Any],
) -> Move:
    """A move, or, where a lane check refuses the moved lane, a move that only reports
    why (its trial then says so instead of the sweep stopping)."""
    try:
        moved = replace(
            pair,
            a=replace(pair.a, **changes_a) if changes_a else pair.a,
            b=replace(pair.b, **changes_b),
        )
    except SpecdiffError as error:
        return Move(setting, key, value, scope, None, str(error))
    return Move(setting, key, value, scope, moved)


def explain_pair(
    pair: Pair,
    prompt: str,
    max_tokens: int,
    max_runs: int,
    cache_dir: str | None = None,
    *,
    cancel: threading.Event | None = None,
    progress: Progress = _quiet,
) -> Autopsy:
    """The whole autopsy of `pair` on `prompt`. Shaped for `call_in_worker`: its
    arguments and its value pickle, and `progress` receives one AutopsyStage per stage,
    with the time left estimated from the runs measured before it."""
    if max_runs < 1:
        raise AutopsyError(f"--max-runs must be at least 1, got {max_runs}")
    refuse_servers(pair)
    cancel = cancel or threading.Event()
    began = time.perf_counter()
    pool = ModelPool()
    try:
        cache = _TrialCache(Path(cache_dir) if cache_dir else None, prompt, max_tokens)
        clock = _Clock(lambda move: _trial(move, prompt, max_tokens, pool, cancel, cache))
        moves = plan_moves(pair)
        room = max_runs - 1
        runs = min(max_runs, len(moves) + 1)
        progress(AutopsyStage("the pair as given", 1, runs))
        baseline = clock.trial(Move("as given", "", "", "as given", pair))
        if baseline.error is not None:
            raise AutopsyError(f"the pair as given failed: {baseline.error}")
        if baseline.identical:
            return Autopsy(
                pair.name, max_tokens, None, (baseline,), max_runs, seconds=_since(began)
            )
        trials = [baseline, *_sweep(clock, moves[:room], runs, baseline.fork, progress)]
        not_tried = tuple(f"{move.setting} (over --max-runs)" for move in moves[room:])
        if baseline.fork is not None:
            left = clock.seconds_left(0, baseline.fork)
            progress(AutopsyStage(f"tapping both lanes at token {baseline.fork}", None, runs, left))
        part2 = _part2(pair, prompt, max_tokens, baseline, pool, cancel)
        return replace(
            part2,
            trials=tuple(trials),
            max_runs=max_runs,
            not_tried=not_tried,
            seconds=_since(began),
        )
    except Cancelled:
        raise AutopsyInterrupted("interrupted before the autopsy was complete") from None
    finally:
        pool.close()


def _sweep(
    clock: _Clock, moves: list[Move], runs: int, fork: int | None, progress: Progress
) -> list[SettingTrial]:
    """The trial of each move after the pair as given (run 2 on), each stage reported
    with the time left as measured so far."""
    trials = []
    for number, move in enumerate(moves, start=2):
        left = clock.seconds_left(runs - number + 1, fork)
        progress(AutopsyStage(move.setting, number, runs, left))
        trials.append(clock.trial(move))
    return trials


class _Clock:
    """The seconds each run took, and from them about how long the rest of an autopsy
    takes. A run read from the cache, or one that failed, is not counted: it tells
    nothing of how long a decode takes."""

    def __init__(self, run: Callable[[Move], SettingTrial]) -> None:
        self.run = run
        self.runs: list[float] = []
        self.steps: list[float] = []
        """Seconds per lockstep step (one token of each lane) of each run measured."""

    def trial(self, move: Move) -> SettingTrial:
        """The trial of `move`, its seconds noted."""
        began = time.perf_counter()
        trial = self.run(move)
        seconds = time.perf_counter() - began
        if not trial.cached and trial.error is None:
            self.runs.append(seconds)
            self.steps.append(seconds / max(1, trial.tokens_a, trial.tokens_b))
        return trial

    def seconds_left(self, runs_left: int, fork: int | None) -> float | None:
        """`runs_left` runs at the mean of those measured, then part 2: each lane decodes
        the prefix up to `fork` once more, with its taps (None: no part 2). None until
        one run was measured."""
        if not self.runs:
            return None
        part2 = 0.0 if fork is None else sum(self.steps) / len(self.steps) * (fork + 1)
        return sum(self.runs) / len(self.runs) * runs_left + part2


def _part2(
    pair: Pair,
    prompt: str,
    max_tokens: int,
    baseline: SettingTrial,
    pool: ModelPool,
    cancel: threading.Event,
) -> Autopsy:
    """Both lanes tapped at the fork the pair as given reached; a note instead where
    the lanes differ only in length."""
    if baseline.fork is None:
        # one lane stopped early with the same tokens: no step holds two picks
        return Autopsy(
            pair.name,
            max_tokens,
            min(baseline.tokens_a, baseline.tokens_b),
            part2_note="the lanes differ only in length (one stopped early); "
            "there is no fork step to trace",
        )
    return _layers(pair, prompt, max_tokens, baseline.fork, pool, cancel)


def server_trial(
    pair: Pair,
    prompt: str,
    max_tokens: int,
    setting: str,
    key: str,
    value: str,
    scope: str,
    *,
    cancel: threading.Event | None = None,
) -> SettingTrial:
    """One run of a pair with server lanes, for a sweep whose moves are made outside the
    lanes (a server restarted with another draft length). Not cached: a server's
    settings are its own, not the lane's. Shaped for `call_in_worker`."""
    cancel = cancel or threading.Event()
    pool = ModelPool()
    try:
        move = Move(setting, key, value, scope, pair)
        return _trial(move, prompt, max_tokens, pool, cancel, _TrialCache(None, prompt, 0))
    except Cancelled:
        raise AutopsyInterrupted("interrupted before the autopsy was complete") from None
    finally:
        pool.close()


def _since(began: float) -> float:
    return round(time.perf_counter() - began, 3)


def _trial(
    move: Move,
    prompt: str,
    max_tokens: int,
    pool: ModelPool,
    cancel: threading.Event,
    cache: _TrialCache,
) -> SettingTrial:
    """One run of the moved pair; its outcome, from the cache where it was run before.

    A trial's answer is where its lanes first differ, or that they never do: once they
    have forked nothing later can change it, so the run stops there (its token counts
    end at the fork) and only a trial whose lanes keep agreeing decodes the whole
    budget. The fork is found by the same runner, at the same step, as `specdiff run`
    finds it."""
    if move.pair is None:
        return SettingTrial(
            move.setting, move.key, move.value, move.scope, None, 0, 0, 0.0, 0.0, move.error
        )
    cached = cache.get(move)
    if cached is not None:
        return cached
    try:
        result = _run_to_answer(move.pair, prompt, max_tokens, pool, cancel)
    except SpecdiffError as error:
        return SettingTrial(
            move.setting, move.key, move.value, move.scope, None, 0, 0, 0.0, 0.0, str(error)
        )
    failure = "; ".join(result.error_lines()) or None
    fork = result.comparison.fork
    trial = SettingTrial(
        move.setting,
        move.key,
        move.value,
        move.scope,
        None if fork is None else fork.index,
        len(result.a.steps),
        len(result.b.steps),
        round(result.a.tokens_per_second, 2),
        round(result.b.tokens_per_second, 2),
        failure,
    )
    if failure is None:
        cache.put(move, trial)
    return trial


def _run_to_answer(
    pair: Pair, prompt: str, max_tokens: int, pool: ModelPool, cancel: threading.Event
) -> PairResult:
    """The pair run until its lanes fork, or to the budget where they never do. Its own
    stop ends it at the fork; the user's `cancel` raises Cancelled."""
    answered = _TrialStop(cancel)
    with PairRun(pair, cancel=answered, pool=pool) as run:
        for _ in run.stream(prompt, max_tokens):
            if cancel.is_set():
                raise Cancelled("cancelled")
            if _forked(run.outcomes):
                answered.set()
        result = run.result
    assert result is not None  # the stream ran to its end
    if cancel.is_set() or result.cancelled and not answered.answered:
        raise Cancelled("cancelled")
    return result


class _TrialStop(threading.Event):
    """A trial's own stop, set once its answer is known. It also reads as set while the
    user's cancel is, so a lane that is loading or decoding stops for either; `answered`
    tells the two apart (a user's cancel raises Cancelled, an answer is a trial)."""

    def __init__(self, user: threading.Event) -> None:
        super().__init__()
        self.user = user

    def is_set(self) -> bool:
        return super().is_set() or self.user.is_set()

    @property
    def answered(self) -> bool:
        return super().is_set()


def _forked(outcomes: Mapping[LaneId, LaneOutcome]) -> bool:
    """Whether the latest step both lanes have streamed holds two different picks. Asked
    after every step, so the first such step is the run's fork."""
    if set(outcomes) != {"a", "b"}:
        return False
    a, b = outcomes["a"].steps, outcomes["b"].steps
    both = min(len(a), len(b))
    return both > 0 and a[both - 1].token_id != b[both - 1].token_id


class _TrialCache:
    """Trial outcomes on disk, one JSON file per prompt (and budget, build and
    specdiff version), keyed inside it by the trial's two lanes."""

    def __init__(self, folder: Path | None, prompt: str, max_tokens: int) -> None:
        self.path: Path | None = None
        self.entries: dict[str, Any] = {}
        if folder is None:
            return
        build = build_info()
        identity = json.dumps(
            [prompt, max_tokens, __version__, build["llama_cpp_build"], build["system_info"]]
        )
        name = hashlib.sha256(identity.encode("utf-8")).hexdigest()[:32]
        self.path = folder / f"{name}.json"
        try:
            loaded = json.loads(self.path.read_text(encoding="utf-8"))
            if isinstance(loaded, dict):
                self.entries = loaded
        except (OSError, ValueError):
            self.entries = {}  # no cache, or a damaged one: run again

    @staticmethod
    def _key(move: Move) -> str:
        assert move.pair is not None  # a move with no lanes never runs
        lanes = [_model_identity(move.pair.a), _model_identity(move.pair.b)]
        return hashlib.sha256(json.dumps(lanes, sort_keys=True).encode()).hexdigest()

    def get(self, move: Move) -> SettingTrial | None:
        entry = self.entries.get(self._key(move))
        if not isinstance(entry, dict):
            return None
        try:
            return SettingTrial(
                move.setting,
                move.key,
                move.value,
                move.scope,
                _optional_int(entry["fork"]),
                int(entry["tokens_a"]),
                int(entry["tokens_b"]),
                float(entry["speed_a"]),
                float(entry["speed_b"]),
                cached=True,
            )
        except (KeyError, TypeError, ValueError):
            return None

    def put(self, move: Move, trial: SettingTrial) -> None:
        if self.path is None:
            return
        self.entries[self._key(move)] = {
            "fork": trial.fork,
            "tokens_a": trial.tokens_a,
            "tokens_b": trial.tokens_b,
            "speed_a": trial.speed_a,
            "speed_b": trial.speed_b,
        }
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(self.path, json.dumps(self.entries))
        except OSError:
            pass  # a cache that cannot be written only costs a rerun


def _optional_int(value: object) -> int | None:
    return None if value is None else int(str(value))


def _model_identity(lane: Lane) -> dict[str, Any]:
    """A lane's settings, with its model file's size and time in place of its contents
    (hashing 250 MB for a cache key would cost a second)."""
    record = lane.as_dict()
    path = Path(lane.model)
    if path.is_file():
        stat = path.stat()
        record["model_file"] = [str(path.resolve()), stat.st_size, stat.st_mtime_ns]
    return record


# -- part 2 ---------------------------------------------------------------------------


def _layers(
    pair: Pair,
    prompt: str,
    max_tokens: int,
    fork: int,
    pool: ModelPool,
    cancel: threading.Event,
) -> Autopsy:
    """Both lanes tapped at the fork step and compared."""
    taps_a = tap_step(pair.a, "a", prompt, max_tokens, fork, pool, cancel)
    taps_b = tap_step(pair.b, "b", prompt, max_tokens, fork, pool, cancel)
    tensors = compare_taps(taps_a, taps_b)
    notes = []
    if taps_a.token_id == taps_b.token_id:
        notes.append(
            f"replayed, both lanes picked the same token at {fork}: the run's fork did not "
            "come out again"
        )
    return Autopsy(
        pair.name,
        max_tokens,
        fork,
        tensors=tuple(tensors),
        layers=tuple(layer_growth(tensors)),
        margin=fork_margin(taps_a, taps_b),
        verify_width=(len(taps_a.target.flags), len(taps_b.target.flags)),
        tapping_neutral=taps_a.neutral and taps_b.neutral,
        notes=tuple(notes),
    )


def compare_taps(a: StepTaps, b: StepTaps) -> list[TensorDifference]:
    """Every tensor both lanes tapped, in lane a's graph order: bytes, then numbers."""
    others = {tensor.key: tensor for tensor in b.tensors}
    differences_found = []
    for tensor in a.tensors:
        other = others.get(tensor.key)
        if other is None or other.values.shape != tensor.values.shape:
            continue  # a node only one lane's graph has (flash attention's, say)
        differences_found.append(_compared(tensor, other))
    return differences_found


def _compared(tensor: TappedTensor, other: TappedTensor) -> TensorDifference:
    """One tensor of lane a against the same of lane b."""
    name = tensor.name if tensor.occurrence == 0 else f"{tensor.name}#{tensor.occurrence}"
    if tensor.values.tobytes() == other.values.tobytes():
        return TensorDifference(
            name, tensor.layer, tensor.op, tensor.shape, other.shape, True, 0.0, 0.0
        )
    va = tensor.values.astype(np.float64)
    delta = va - other.values.astype(np.float64)
    norm = float(np.linalg.norm(va))
    # cells both lanes wrote in earlier calls lead a cache's values: a difference
    # among them is history the step read, not arithmetic it did
    history = min(tensor.history, other.history)
    inherited = history > 0 and bool(np.any(delta[:history] != 0))
    return TensorDifference(
        name,
        tensor.layer,
        tensor.op,
        tensor.shape,
        other.shape,
        False,
        float(np.max(np.abs(delta))),
        float(np.linalg.norm(delta)) / norm if norm > 0 else float("inf"),
        kv_history=inherited,
    )


def layer_growth(tensors: list[TensorDifference]) -> list[LayerGrowth]:
    """Each layer's output (its last `l_out` tensor) compared."""
    by_layer: dict[int, TensorDifference] = {}
    for tensor in tensors:
        base, _ = split_name(tensor.name.split("#")[0])
        if base == "l_out" and tensor.layer is not None:
            by_layer[tensor.layer] = tensor
    return [
        LayerGrowth(layer, found.max_abs, found.rel_l2) for layer, found in sorted(by_layer.items())
    ]


def fork_margin(a: StepTaps, b: StepTaps) -> ForkMargin:
    """The two picks at the step, as each lane's logits score them."""
    x, y = a.token_id, b.token_id
    la, lb = a.logits.astype(np.float64), b.logits.astype(np.float64)
    pa, pb = _softmax(la), _softmax(lb)
    margin = float(la[x] - la[y])
    gap_b = float(lb[x] - lb[y])
    return ForkMargin(
        x,
        y,
        _quoted(a.piece),
        _quoted(b.piece),
        (float(pa[x]), float(pa[y])),
        (float(pb[x]), float(pb[y])),
        margin,
        margin - gap_b,
        float(np.max(np.abs(la - lb))),
    )


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted: np.ndarray = np.exp(logits - np.max(logits))
    normalized: np.ndarray = shifted / shifted.sum()
    return normalized


def _quoted(piece: bytes) -> str:
    """A token's text, quoted, control characters made visible."""
    return repr(visible(piece.decode("utf-8", "replace"), 40))
