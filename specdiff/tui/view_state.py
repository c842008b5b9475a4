"""What the compare screen shows, as plain Python: the run or session on screen (its pair,
its session file or live result), each lane's steps and text, the fork, the cursor and
the diff after the fork, and the rules that move them (where `n` goes, what a replay
stepping back forgets, what a stats line keeps at a width).

The one source of truth for the screen: the controllers (`live`, `replay`, `explain`,
`output`) change it and say what changed; the screen draws what it holds. No Textual
import: these rules are tested in the fast tier.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from specdiff.compare import DEFAULT_NEAR_TIE, Fork, align_after, fork_at, near_ties
from specdiff.forecast import FlipModel, forecast, model_for
from specdiff.fork_words import counted
from specdiff.lanes import Pair, differences
from specdiff.results import PairResult
from specdiff.safe_text import visible
from specdiff.sessions.store import Session
from specdiff.steps import TokenStep

FORECAST_SHOWN = 5
"""How many forecast steps the lane ahead marks."""
LANE_IDS = ("a", "b")


@dataclass
class LaneState:
    """What the app knows of one lane: its steps and their decoded text so far."""

    lane_id: str
    steps: list[TokenStep] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    speed: float = 0.0
    """Tokens/s over the lane's own decode time (the runner's clock, not the wall's)."""
    drafted: int = 0
    accepted: int = 0
    error: str | None = None
    decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace")
    )

    def extend(self, steps: Iterable[TokenStep]) -> None:
        # A token may hold part of a UTF-8 character: the character shows on the token
        # that completes it.
        for step in steps:
            self.steps.append(step)
            self.texts.append(self.decoder.decode(step.piece))

    def truncate(self, length: int) -> None:
        """Keep the first `length` steps (a replay stepping back)."""
        del self.steps[length:], self.texts[length:]
        # The decoder may hold the first bytes of a character split over tokens:
        # rebuild its state from the steps that remain.
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        for step in self.steps:
            self.decoder.decode(step.piece)


def pending_forecast(
    steps: Sequence[TokenStep], other_length: int, forked: bool, model: FlipModel
) -> frozenset[int]:
    """The steps of a lane ahead that the forecast ranks likeliest to be the first fork,
    among those the other lane has not reached: the lanes agree so far, so the first fork
    lies there or nowhere. Nothing once the lanes have forked, or for the lane behind."""
    if forked or len(steps) <= other_length:
        return frozenset()
    return frozenset(forecast(steps, FORECAST_SHOWN, model, start=other_length).indices)


def lane_differences(pair: Pair) -> tuple[str, ...]:
    """The pair's differing keys, "key a / b" each, as the panel lists them."""
    return tuple(
        visible(f"{key} {pair.a.shown(key)} / {pair.b.shown(key)}")
        for key in differences(pair.a, pair.b)
    )


def near_ties_before(
    steps: Sequence[TokenStep], threshold: float, fork: Fork | None
) -> tuple[tuple[int, float], ...]:
    """(index, margin) of a lane's near ties before the fork (all of them without one).
    The one definition of the near ties the app points at: the panes shade these (after
    the fork a token's colour says which lane has it), n and p visit these, the panel
    and the stats line count these."""
    end = fork.index if fork is not None else len(steps)
    return tuple((index, steps[index].margin) for index in near_ties(steps[:end], threshold))


def fitted(parts: Sequence[str], width: int) -> str:
    """As many whole parts as fit in `width` columns, in order: a cut line never ends in a
    name without its value."""
    shown: list[str] = []
    for part in parts:
        line = " · ".join([*shown, part])
        if shown and len(line) > width:
            break
        shown.append(part)
    return " · ".join(shown)


def other_lane(lane_id: str) -> str:
    return "b" if lane_id == "a" else "a"


class CompareView:
    """A run (or a session) on screen: its pair and session, both lanes' steps, the fork
    once the lanes differ, the cursor, and what differs after the fork."""

    def __init__(self, pair: Pair, near_tie: float = DEFAULT_NEAR_TIE) -> None:
        self.pair = pair
        """The pair on screen: the one running or last run, or the session's."""
        self.near_tie = near_tie
        self.session: Session | None = None
        """The recorded session on screen, until a live run replaces it."""
        self.running = False
        """The lanes are generating."""
        self.cursor_lane = "a"
        """The lane `l` switches to and from: its pane is framed, n and p search it."""
        self.reset()

    @property
    def replaying(self) -> bool:
        """A recorded session is on screen (no live run has replaced it)."""
        return self.session is not None

    def show_session(self, session: Session) -> None:
        """A recorded session replaces what is on screen."""
        self.reset()
        self.session = session
        self.pair = session.pair

    def start_live(self, pair: Pair) -> None:
        """A live run of `pair` replaces what is on screen (a replay included)."""
        self.reset()
        self.session = None
        self.pair = pair

    def reset(self) -> None:
        """Nothing on screen yet (a new run, or a session about to be shown)."""
        self.lanes = {"a": LaneState("a"), "b": LaneState("b")}
        self.fork: Fork | None = None
        self.stopped_by: str | None = None
        """The lane whose failure stopped the run: the other lane's pane says so."""
        self.changed: dict[str, set[int]] = {"a": set(), "b": set()}
        self.similarity: float | None = None
        self.result: PairResult | None = None
        self.cursor: int | None = None
        self.follow = True
        """The panes follow the newest token (until the fork, or a key, holds them)."""

    def reset_keeping_speeds(self) -> None:
        """Nothing on screen, but each lane keeps its speed (a replay played again)."""
        speeds = {lane_id: state.speed for lane_id, state in self.lanes.items()}
        self.reset()
        for lane_id, speed in speeds.items():
            self.lanes[lane_id].speed = speed

    def add(self, steps: Iterable[TokenStep]) -> None:
        """Steps of either lane, in the order they came."""
        for step in steps:
            self.lanes[step.lane].extend((step,))

    def find_fork(self) -> bool:
        """Look for the fork in what has arrived; True when it was found just now. A found
        fork holds the panes (later tokens no longer drag them to the end) and takes the
        cursor, so that ←/→, n and p go on from there."""
        if self.fork is not None:
            return False
        fork = fork_at(self.lanes["a"].steps, self.lanes["b"].steps)
        if fork is None:
            return False
        self.fork, self.follow, self.cursor = fork, False, fork.index
        return True

    def update_comparison(self) -> bool:
        """The fork and the diff after it, from everything that has arrived; True when
        the fork was found just now."""
        found = self.find_fork()
        if self.fork is not None:
            a, b = self.lanes["a"].steps, self.lanes["b"].steps
            alignment = align_after(a, b, self.fork.index)
            self.similarity = alignment.similarity
            changed: dict[str, set[int]] = {"a": set(), "b": set()}
            for tag, a0, a1, b0, b1 in alignment.opcodes:
                if tag != "equal":
                    changed["a"].update(range(self.fork.index + a0, self.fork.index + a1))
                    changed["b"].update(range(self.fork.index + b0, self.fork.index + b1))
            self.changed = changed
        return found

    def forget_last(self, lane_id: str, index: int) -> None:
        """A replay stepping back hides lane `lane_id`'s step `index`: a fork at or after
        it is not reached any more."""
        self.lanes[lane_id].truncate(index)
        if self.fork is not None and index <= self.fork.index:
            self.fork, self.similarity = None, None
            self.changed = {"a": set(), "b": set()}

    # -- the cursor

    def near_ties(self) -> tuple[int, ...]:
        """The current lane's near ties, by index: those shaded, before the fork."""
        steps = self.lanes[self.cursor_lane].steps
        return tuple(index for index, _ in near_ties_before(steps, self.near_tie, self.fork))

    def next_tie(self) -> int | None:
        """The current lane's first near tie after the cursor (from the start without one)."""
        later = [i for i in self.near_ties() if self.cursor is None or i > self.cursor]
        return later[0] if later else None

    def previous_tie(self) -> int | None:
        """The current lane's last near tie before the cursor (none without a cursor)."""
        earlier = [i for i in self.near_ties() if self.cursor is not None and i < self.cursor]
        return earlier[-1] if earlier else None

    def no_tie_note(self, where: str) -> str:
        """What n (`where` "after") or p ("before") says when there is no near tie that
        way: after the fork it says why n stops there."""
        if self.fork is not None and where == "after":
            # short enough to stay whole at 80 columns, before the status it leads
            return (
                f"no tie after this in lane {self.cursor_lane} before the fork "
                f"(token {self.fork.index}): near ties end there"
            )
        return f"no near tie {where} this in lane {self.cursor_lane}"

    def moved(self, delta: int) -> int | None:
        """Where ←/→ take the cursor in the current lane: from the start (or the end)
        without a cursor, never past either end; None while the lane is empty."""
        steps = self.lanes[self.cursor_lane].steps
        if not steps:
            return None
        start = self.cursor if self.cursor is not None else (0 if delta > 0 else len(steps))
        return max(0, min(len(steps) - 1, start + delta))

    def switched(self) -> tuple[str, int | None]:
        """The other lane and where the cursor lands in it: the same index, or its last
        token where it is shorter."""
        other = other_lane(self.cursor_lane)
        index = self.cursor
        if index is not None:
            shown = len(self.lanes[other].steps)
            index = min(index, shown - 1) if shown else None
        return other, index

    def select(self, lane_id: str, index: int | None) -> None:
        """Put the cursor on `index` of `lane_id`: the panes stop following the end."""
        self.cursor_lane = lane_id
        self.cursor = index
        self.follow = False

    def holds(self, lane_id: str, index: int) -> bool:
        return lane_id in self.lanes and 0 <= index < len(self.lanes[lane_id].steps)

    def panel_index(self) -> int | None:
        """The step the panel shows: the cursor's, else the fork's."""
        if self.cursor is not None:
            return self.cursor
        return self.fork.index if self.fork is not None else None

    def generated(self) -> int:
        return max(len(state.steps) for state in self.lanes.values())

    def forecast_marks(self, lane_id: str) -> frozenset[int]:
        """The steps of lane `lane_id` the forecast marks (`pending_forecast`)."""
        return pending_forecast(
            self.lanes[lane_id].steps,
            len(self.lanes[other_lane(lane_id)].steps),
            self.fork is not None,
            model_for(self.pair.name),
        )

    # -- what a lane's stats line says

    def stats_line(self, lane_id: str, width: int | None = None) -> str:
        """The lane's numbers, as many whole ones as fit `width` when given (the error is
        in full under the lane's tokens)."""
        footer = self.session.footer if self.session is not None else None
        grade = footer.grades[0 if lane_id == "a" else 1] if footer and footer.grades else None
        parts = self.stats_parts(
            lane_id, self.pair, None if grade is None else (grade.passed, grade.reason)
        )
        return " · ".join(parts) if width is None else fitted(parts, width)

    def stats_parts(self, lane_id: str, pair: Pair, grade: tuple[bool, str] | None) -> list[str]:
        """The lane's numbers, most important first; `grade` is (passed, reason) where a
        graded session gives one."""
        state = self.lanes[lane_id]
        parts = [counted(len(state.steps), "token")]
        if state.steps:  # a lane with no tokens has no rate to speak of
            parts.append(f"{state.speed:.1f} tok/s")
        if state.error:
            parts.insert(0, "ERROR")
        elif self.stopped_by not in (None, lane_id):
            parts.insert(0, f"stopped: lane {self.stopped_by} failed")
        if getattr(pair, lane_id).speculative and state.drafted:
            parts.append(f"{state.accepted / state.drafted:.0%} accepted")
        ties = len(near_ties_before(state.steps, self.near_tie, self.fork))
        parts.append(counted(ties, "near tie"))
        if grade is not None:
            parts.insert(1, "PASS" if grade[0] else "FAIL")
            parts.append(f"graded: {grade[1]}")
        return parts
