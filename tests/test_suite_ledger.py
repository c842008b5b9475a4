"""A suite keeps its prompt records in a file, not in memory (`specdiff.suite.ledger`):
they come back in the suite's order whatever order the runs ended in, the reports are
written from them a record at a time, and the memory a suite holds does not grow with
its prompt count beyond a few numbers a prompt."""

from __future__ import annotations

import json
import random
import tracemalloc
from dataclasses import replace

import pytest

from specdiff.json_numbers import finite_everywhere
from specdiff.reports.suite import report_json_chunks, write_reports
from specdiff.safe_text import json_text
from specdiff.sessions.records import Serving
from specdiff.suite.ledger import Ledger
from specdiff.suite.stats import summarize
from tests.test_suite_stats import PAIR, Run, record, suite_data, table
from tests.test_terminal_safety import ENCODABLE_IDS, assert_terminal_safe

pytestmark = pytest.mark.filterwarnings("error")


def _varied(n: int):
    """A run unlike its neighbours: its own fork, margins, seconds, back-off and grade,
    with values whose float sums depend on the order they are added in."""
    kinds = [
        Run(False, (True, False), "near tie"),
        Run(True, (True, True)),
        Run(False, None, failure="failed"),
        Run(False, (False, True), "ambiguous"),
    ]
    base = record(f"p{n}", kinds[n % len(kinds)], f"error {n}")
    summary = base.summary
    forked = summary.fork_index is not None
    return replace(
        base,
        summary=replace(
            summary,
            fork_index=n % 40 if forked else None,
            fork_margins=(0.1 * (n % 7), 0.3) if forked else None,
            seconds=(0.1 * (n % 3 + 1), 0.7),
            tokens_per_second=(10.0 + n, 20.0 + n % 5),
            serving=(Serving(f"http://e{n % 2}", n % 3, 0.1 * (n % 4)), None),
        ),
    )


def test_figures_and_records_do_not_depend_on_the_order_runs_end(tmp_path):
    records = [_varied(n) for n in range(60)]
    in_order = summarize(records, 48, 0.5)
    for seed in range(5):
        places = list(range(60))
        random.Random(seed).shuffle(places)
        ledger = Ledger([PAIR], tmp_path)
        for place in places:
            ledger.add(records[place], place)
        view = ledger.records()
        assert [r["prompt_id"] for r in view] == [f"p{n}" for n in range(60)]
        assert view[5] == json.loads(json.dumps(records[5].to_json()))
        assert [r["prompt_id"] for r in view[-2:]] == ["p58", "p59"]
        # the same figures to the last digit: forks listed in suite order, the runs
        # left out of pass@1 too, and float sums that do not follow the arrival order
        assert ledger.figures[PAIR].summary(48, 0.5) == in_order
        ledger.close()
    finished = [r.summary for r in records if not r.summary.failed]
    assert in_order["fork_indices"] == [r.fork_index for r in finished if r.fork_index is not None]
    assert in_order["grades"]["excluded"][0]["prompt_id"] == "p2"
    # the file has no name: nothing is left in the report folder
    assert list(tmp_path.iterdir()) == []


def test_the_first_error_is_the_earliest_in_suite_order(tmp_path):
    failed = [Run(False, None, failure="failed"), Run(False, None, failure="failed")]
    ledger = Ledger([PAIR], tmp_path)
    ledger.add(record("late", failed[0], "the second error"), 9)
    ledger.add(record("early", failed[1], "the first error"), 2)
    assert ledger.first_error == f"{PAIR} early: the first error"
    assert (ledger.count, ledger.finished) == (2, 0)


@pytest.mark.parametrize("count", [0, 1, 7, 20])
def test_report_json_written_a_record_at_a_time_is_the_whole_json(count):
    runs = table(8, 3, 3, 3, 1, failures=("crashed", "failed"))[:count]
    # U+2028 and U+0085 end a line for str.splitlines, and JSON leaves them raw
    odd = [*ENCODABLE_IDS, "line\u2028separator", "next\x85line"]
    ids = [odd[(n * 5) % len(odd)] + f"#{n}" for n in range(count)]
    data = suite_data(runs, ids)
    streamed = "".join(report_json_chunks(data))
    whole = {**data, "prompts": list(data["prompts"])}
    text = json.dumps(finite_everywhere(whole), indent=1, ensure_ascii=False) + "\n"
    assert streamed == json_text(text)
    assert [r["prompt_id"] for r in json.loads(streamed)["prompts"]] == ids
    # the controls JSON leaves raw (C1, line separators, bidi marks) are escaped
    assert_terminal_safe(streamed)


RUN_KINDS = [
    Run(True, (True, True)),
    Run(False, (True, False), "near tie"),
    Run(False, (False, True), "ambiguous"),
    Run(False, None, failure="failed"),
]


def _held_per_record(tmp_path, kinds: list[Run], graded: bool) -> float:
    """The bytes a ledger holds for each record past its first 500."""
    records = [record(f"p{n}", kind) for n, kind in enumerate(kinds)]
    ledger = Ledger([PAIR], tmp_path, graded)
    tracemalloc.start()
    try:
        for place in range(500):
            ledger.add(records[place % len(records)], place)
        before = tracemalloc.get_traced_memory()[0]
        for place in range(500, 2500):
            ledger.add(records[place % len(records)], place)
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
        ledger.close()
    return (after - before) / 2000


FINISHED = [kind for kind in RUN_KINDS if kind.failure is None]


def test_a_suite_holds_a_few_numbers_a_prompt_not_its_record(tmp_path):
    # a record as an object held ~1.3 KB; the ledger keeps its place, its line's place
    # and the numbers medians need: about 60 bytes, arrays growing in steps
    assert _held_per_record(tmp_path, FINISHED, graded=True) < 120
    # an ungraded suite's runs are not named as left out of a pass@1 it never shows
    ungraded = [Run(kind.identical, None, kind.fork_class) for kind in RUN_KINDS]
    assert _held_per_record(tmp_path, ungraded, graded=False) < 120


def _report_peak(folder, count: int) -> tuple[int, int]:
    """The most memory writing the reports of `count` runs held at once, and the bytes
    the four files hold. The runs finish (a failed run is named in the report's text,
    so a suite of failures holds their names)."""
    runs = [FINISHED[n % len(FINISHED)] for n in range(count)]
    data = suite_data(runs, [f"HumanEval/{n}" for n in range(count)])
    folder.mkdir()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        paths = write_reports(folder, data)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    return peak, sum(path.stat().st_size for path in paths)


def test_the_reports_are_written_holding_one_record_at_a_time(tmp_path):
    peak, written = _report_peak(tmp_path / "small", 300)
    more_peak, more_written = _report_peak(tmp_path / "large", 900)
    # each run adds about 1.5 KB to the files and a few bytes (its id in the settings,
    # its fork in the figures) to what writing them holds
    assert more_written - written > 600 * 1000
    assert (more_peak - peak) / 600 < 64


def test_a_fork_past_the_tokens_a_footer_counts_is_still_reported():
    # a footer edited by hand: its fork lies beyond both lanes' token counts
    forked = record("p0", Run(False, None, "near tie"))
    edited = replace(forked, summary=replace(forked.summary, fork_index=500, generated=(9, 9)))
    summary = summarize([edited], 48, 0.5)
    assert summary["fork_indices"] == [500]
    assert summary["forked_by_token"][-1] == 1
