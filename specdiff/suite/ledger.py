"""A suite's prompt records, kept out of memory: each record is written as one JSON line
to a file of its own as its run ends, and the pair's figures are gathered from it at
once (`PairFigures`). What stays in memory per record is its place in the suite's order
and its line's place in the file (16 bytes), so a suite of ten thousand prompts holds no
more objects than a suite of ten, and the reports read the records back in the suite's
order, one at a time.

The file is anonymous, in the report folder beside the session files (a temporary folder
may be memory): it is gone when the suite ends, and a `--resume` builds it again from
the session files, which stay the record of every run."""

from __future__ import annotations

import json
import tempfile
import threading
import weakref
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any, overload

from specdiff.suite.records import PromptRecord
from specdiff.suite.stats import PairFigures


class Ledger:
    """The records of one suite run, added in the order their runs end (from any
    thread), read back in the suite's order."""

    def __init__(
        self, labels: Sequence[str], folder: Path | None = None, graded: bool = True
    ) -> None:
        # the ledger holds the file as long as it lives; close() ends it
        self._file: IO[bytes] = tempfile.TemporaryFile(dir=folder)  # noqa: SIM115
        # a ledger nobody closed (a test's, a benchmark's) closes its file as it goes
        weakref.finalize(self, self._file.close)
        self._lock = threading.Lock()
        self._order = array("q")
        """Each record's place in the suite (pair, then prompt), in the order added."""
        self._offsets = array("q")
        self._lengths = array("q")
        self._sorted: array[int] | None = None
        """Indices of the added records in suite order; None until asked for again."""
        self.figures = {label: PairFigures(graded) for label in labels}
        self._graded = graded
        self._first_error: tuple[int, str] | None = None

    def add(self, record: PromptRecord, order: int) -> None:
        """Keep `record`, the `order`-th run of the suite (pairs in turn, each over the
        prompts in turn)."""
        line = json.dumps(record.to_json(), ensure_ascii=False, separators=(",", ":"))
        data = line.encode("utf-8") + b"\n"
        run = record.summary
        error = next((e for e in run.errors if e), None)
        with self._lock:
            self._file.seek(0, 2)
            self._offsets.append(self._file.tell())
            self._file.write(data)
            self._lengths.append(len(data))
            self._order.append(order)
            self._sorted = None
            self.figures.setdefault(record.pair, PairFigures(self._graded)).add(record, order)
            if error and (self._first_error is None or order < self._first_error[0]):
                self._first_error = (order, f"{record.pair} {record.prompt_id}: {error}")

    @property
    def count(self) -> int:
        return len(self._order)

    @property
    def finished(self) -> int:
        """Records of runs that neither failed nor crashed."""
        return sum(figures.finished for figures in self.figures.values())

    @property
    def first_error(self) -> str | None:
        """The error of the earliest run (in suite order) that failed with one."""
        return None if self._first_error is None else self._first_error[1]

    def records(self) -> RecordView:
        """Every record as its JSON object (`PromptRecord.to_json`), in suite order."""
        with self._lock:
            if self._sorted is None:
                self._sorted = self._suite_order()
            return RecordView(self, self._sorted)

    def _suite_order(self) -> array[int]:
        """The records' indices in suite order. Places are distinct and fewer than the
        suite's runs, so each index is put in its place's slot: no list of a Python int
        per record, as sorting would make."""
        slots = array("q", [-1]) * (max(self._order, default=-1) + 1)
        for index, place in enumerate(self._order):
            slots[place] = index
        return array("q", (index for index in slots if index >= 0))

    def _read(self, index: int) -> dict[str, Any]:
        with self._lock:
            self._file.flush()
            self._file.seek(self._offsets[index])
            data = self._file.read(self._lengths[index])
        return dict(json.loads(data))

    def close(self) -> None:
        self._file.close()

    @classmethod
    def of(cls, records: Sequence[PromptRecord]) -> Ledger:
        """A ledger holding `records` in the order given (for reports built from records
        already at hand)."""
        ledger = cls(())
        for order, record in enumerate(records):
            ledger.add(record, order)
        return ledger


class RecordView(Sequence[dict[str, Any]]):
    """The ledger's records in suite order, each read from the file when it is asked
    for: iterating holds one record at a time."""

    def __init__(self, ledger: Ledger, indices: array[int]) -> None:
        self._ledger = ledger
        self._indices = indices

    def __len__(self) -> int:
        return len(self._indices)

    @overload
    def __getitem__(self, position: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, position: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, position: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(position, slice):
            return [self._ledger._read(i) for i in self._indices[position]]
        return self._ledger._read(self._indices[position])

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for index in self._indices:
            yield self._ledger._read(index)
