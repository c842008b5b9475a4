#!/usr/bin/env python3
"""Write every generated picture of the documentation into docs/images/, from committed
files only: no model, no server, no network.

- TUI screenshots (SVG, via Textual's export_screenshot) of the demo session
  `sessions/*-spec-vs-plain-*.jsonl`, opened as `specdiff replay --instant` opens it;
- the report pictures of the suite committed in docs/data/suite-open/ (its session
  files read back by `specdiff suite --resume`, which runs nothing when every run is
  there), drawn by the functions that draw report.html's charts;
- the concept pages' pictures drawn from data: the probabilities and margins of the demo
  session, and the fork forecast's flip chance against the margin.

Pictures that are hand-drawn (the margin, fork-class and noise-floor diagrams) live in
docs/images/ too and are not written here.

A screenshot shows whatever the TUI draws, so after a change to the TUI or the reports run
this again, look at the pictures, and commit them; tests/test_docs_pictures.py fails
while a committed picture differs from what this writes.

Usage: python3 docs/generate.py [--out DIR] [--only screens|plots]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    # run as `python3 docs/generate.py` from a checkout: this checkout's specdiff
    sys.path.insert(0, str(ROOT))

from specdiff.forecast import POOLED_MODEL  # noqa: E402
from specdiff.lanes import presets  # noqa: E402
from specdiff.reports.suite import PAIR_COLORS, fork_histogram_svg, forked_by_length_svg  # noqa: E402
from specdiff.reports.svg import LANE_COLORS, Rule, Series, histogram, line_chart, margin_plot  # noqa: E402
from specdiff.sessions.store import Session, load_session  # noqa: E402

IMAGES = ROOT / "docs" / "images"
DEMO_SESSION = next((ROOT / "sessions").glob("*-spec-vs-plain-*.jsonl"))
SUITE = ROOT / "docs" / "data" / "suite-open"
THEMES = ROOT / "themes"

SCREEN_SIZE = (120, 40)
SCREENS = {
    # file name: the keys pressed once the session is shown
    "tui-fork.svg": ("d",),
    "tui-aligned.svg": ("d", "a"),
    "tui-help.svg": ("question_mark",),
}
"""At the fork (`d` jumps to it), the aligned view, and help."""
SCREEN_THEME = "specdiff-dark"

NEAR_TIE_ZOOM_AFTER_FORK = 10
"""The near-tie picture shows the steps up to a few past the fork, where the margins can
be told apart."""
PROBABILITY_CANDIDATES = 6


# -- TUI screenshots -------------------------------------------------------------------
def demo_app(session: Session) -> object:
    """The demo session in the app, shown at once, as `specdiff replay --instant` shows it."""
    # deferred: Textual loads only for the screenshots
    from specdiff.tui.app import make_app

    known = presets()
    known[session.pair.name] = session.pair
    return make_app(
        known,
        session.pair.name,
        session.prompt,
        session.header.max_tokens,
        theme_name=SCREEN_THEME,
        theme_dirs=[THEMES],
        autostart=False,
        session=session,
    )


async def screenshot(keys: tuple[str, ...]) -> str:
    """The SVG of the demo session's screen after `keys`, taken from the checkout's root:
    the status line names the session by its path from the current folder, so the
    pictures read the same wherever the checkout lies."""
    app = demo_app(load_session(DEMO_SESSION))
    was = Path.cwd()
    os.chdir(ROOT)
    try:
        async with app.run_test(size=SCREEN_SIZE) as pilot:  # type: ignore[attr-defined]
            await pilot.pause()
            for key in keys:
                await pilot.press(key)
            await pilot.wait_for_scheduled_animations()
            await pilot.pause()
            return app.export_screenshot(title="specdiff")  # type: ignore[attr-defined]
    finally:
        os.chdir(was)


def write_screens(out: Path) -> list[Path]:
    written = []
    for name, keys in SCREENS.items():
        written.append(write(out / name, asyncio.run(screenshot(keys))))
    return written


# -- report pictures ------------------------------------------------------------------
def suite_report_data(suite: Path = SUITE) -> dict[str, object]:
    """The committed suite's report.json, written afresh by `specdiff suite --resume` on a
    copy of the folder: every run is in its session files, so nothing runs."""
    # deferred: the command line is needed only for the report pictures
    from specdiff.cli import main

    with tempfile.TemporaryDirectory(prefix="specdiff-docs-") as scratch:
        report = Path(scratch) / "suite"
        shutil.copytree(suite, report)
        code = main(["suite", "--resume", "--report", str(report)])
        if code != 0:
            raise SystemExit(f"generate.py: specdiff suite --resume exited {code} on {suite}")
        return json.loads((report / "report.json").read_text(encoding="utf-8"))


def write_report_pictures(out: Path) -> list[Path]:
    data = suite_report_data()
    written = [write(out / "report-forked-by-length.svg", forked_by_length_svg(data))]
    for number, pair in enumerate(data["pairs"]):  # type: ignore[attr-defined]
        color = PAIR_COLORS[number % len(PAIR_COLORS)]
        name = f"report-fork-histogram-{pair['label']}.svg"
        written.append(write(out / name, fork_histogram_svg(pair, color)))
    return written


# -- concept pictures -----------------------------------------------------------------
def write_concept_pictures(out: Path) -> list[Path]:
    session = load_session(DEMO_SESSION)
    fork = session.summary().fork_index
    if fork is None:
        raise SystemExit(f"generate.py: {DEMO_SESSION.name} does not fork")
    margins = {lane: [step.margin for step in session.steps[lane]] for lane in "ab"}
    shown = fork + NEAR_TIE_ZOOM_AFTER_FORK + 1
    return [
        write(out / "concept-probabilities.svg", probabilities_svg(session, fork)),
        write(
            out / "concept-near-ties.svg",
            margin_plot(
                margins["a"][:shown],
                margins["b"][:shown],
                fork_index=fork,
                title="Margin per token, demo session",
            ),
        ),
        write(out / "concept-forecast.svg", forecast_svg()),
    ]


def probabilities_svg(session: Session, fork: int) -> str:
    """Lane a's likeliest tokens at the fork, with their probabilities."""
    step = session.steps["a"][fork]
    candidates = step.top[:PROBABILITY_CANDIDATES]
    chances = [step.probability(candidate.logit) for candidate in candidates]
    if any(chance is None for chance in chances):
        raise SystemExit(f"generate.py: the fork step of {DEMO_SESSION.name} has no normalizer")
    return histogram(
        [100 * (chance or 0.0) for chance in chances],
        [repr(candidate.piece.decode("utf-8", "replace")) for candidate in candidates],
        title=f"Lane a's likeliest next tokens at token {fork} of the demo session",
        x_label="candidate token",
        y_label="probability, %",
        color=LANE_COLORS["a"],
    )


def forecast_svg() -> str:
    """The pooled flip model's chance against the margin, 0 to 1 logit in tenths."""
    margins = [index / 10 for index in range(11)]
    return line_chart(
        [Series("flip chance", [100 * POOLED_MODEL.probability(m) for m in margins])],
        title="Chance that the other lane picks another token, by margin",
        x_label="margin at the step, logits",
        y_label="flip chance, %",
        y_range=(0.0, 30.0),
        vertical=(Rule(margins.index(0.5), "near-tie threshold"),),
        x_labels=[f"{margin:g}" for margin in margins],
    )


# -- the command ----------------------------------------------------------------------
def write(path: Path, svg: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(svg if svg.endswith("\n") else svg + "\n", encoding="utf-8")
    return path


PARTS: dict[str, list[Callable[[Path], list[Path]]]] = {
    "screens": [write_screens],
    "plots": [write_report_pictures, write_concept_pictures],
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=IMAGES, help="folder to write into")
    parser.add_argument("--only", choices=sorted(PARTS), help="only screenshots or only plots")
    args = parser.parse_args(argv)
    for part, writers in PARTS.items():
        if args.only not in (None, part):
            continue
        for writer in writers:
            for path in writer(args.out):
                print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
