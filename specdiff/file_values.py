"""Values read back from a file, each checked where it is read.

Session files, saved autopsies, prompt files and a suite's kept figures may come from
anyone, and Python's `json` reads more than JSON: `NaN`, `Infinity` and `-Infinity`
parse as floats, and `1e999` as infinity. specdiff never writes any of them, and a
reader that let one through would fail far from the file (a chart's axis, a margin's
share), with a traceback instead of a sentence. So every number is checked finite, and
within its field's range, by the functions here, on its way in; each failure is one
`BadValue` line naming the field, what it must hold and what it held, and the reader of
each kind of file puts its file (and line) in front. Nothing past these checks checks
again.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

MAX_WHOLE = 1 << 53
"""The largest whole number any field takes by default: beyond it a float loses units."""
MAX_TOKENS = 1 << 24
"""More tokens than any run makes: a token's index, a lane's count, a prompt's budget."""
NOT_FINITE_FIX = "write a finite number there"
"""What to do about a NaN or an infinity: the file was edited or damaged by hand."""


class BadValue(ValueError):
    """A value in a file that its field cannot hold; the message names the field."""


def shown(value: object) -> str:
    """A value as an error line quotes it: a non-finite float in JSON's spelling (the
    file said NaN or Infinity, or a number too large for a float), anything else
    shortened so that a huge value cannot make a huge line."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, float) and math.isinf(value):
        sign = "-" if value < 0 else ""
        return f"{sign}Infinity (or a number beyond {sign}1.8e308)"
    return f"{value!r:.60}"


def whole_number(value: object, what: str, low: int = 0, high: int = MAX_WHOLE) -> int:
    """An int from `low` to `high` (true and false are not numbers)."""
    if type(value) is not int or not low <= value <= high:
        raise BadValue(f"{what} must be a whole number from {low} to {high}, got {shown(value)}")
    return value


def finite_number(
    value: object, what: str, low: float = -math.inf, high: float = math.inf
) -> float:
    """A finite float from `low` to `high`; an int is taken as its float, where it has
    one (10**400 has none)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadValue(f"{what} must be a number, got {shown(value)}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf if value > 0 else -math.inf
    if not math.isfinite(number):
        raise BadValue(f"{what} must be a finite number, got {shown(number)}; {NOT_FINITE_FIX}")
    if not low <= number <= high:
        raise BadValue(f"{what} must be a number from {low:g} to {high:g}, got {number:g}")
    return number


def text(value: object, what: str, limit: int | None = None) -> str:
    """A string, of at most `limit` characters where a limit is given."""
    if not isinstance(value, str):
        raise BadValue(f"{what} must be text, got {shown(value)}")
    if limit is not None and len(value) > limit:
        raise BadValue(f"{what} must be at most {limit} characters, got {len(value)}")
    return value


def flag(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise BadValue(f"{what} must be true or false, got {shown(value)}")
    return value


def json_object(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadValue(f"{what} must be an object, got {shown(value)}")
    return value


def json_list(value: object, what: str, limit: int | None = None) -> list[Any]:
    """A list, of at most `limit` entries where a limit is given."""
    if not isinstance(value, list):
        raise BadValue(f"{what} must be a list, got {shown(value)}")
    if limit is not None and len(value) > limit:
        raise BadValue(f"{what} must be a list of at most {limit} entries, got {len(value)}")
    return value


class Fields:
    """Typed reads of one JSON object by key, for records read field by field (a saved
    autopsy). A failure is a BadValue naming the field by its path from the record's
    top, after `where`: `run-1.autopsy.json: field 'layers[3].max_abs' must be ...`."""

    def __init__(self, data: object, where: str, path: str = "") -> None:
        self.where = where
        self.path = path
        if not isinstance(data, Mapping):
            wanted = f"field {path!r} must be" if path else "expected"
            raise BadValue(f"{where}: {wanted} an object, got {type(data).__name__}")
        self.data = data

    def _path(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def _name(self, path: str) -> str:
        return f"{self.where}: field {path!r}"

    def refusal(self, key: str, wanted: str) -> BadValue:
        """The error for a field whose value is wrong in a way only its reader knows."""
        return BadValue(f"{self._name(self._path(key))} must {wanted}")

    def get(self, key: str) -> object:
        """The raw value of `key`, which must be present (null counts as present)."""
        if key not in self.data:
            raise BadValue(f"{self.where}: missing field {self._path(key)!r}")
        return self.data[key]

    def text(self, key: str, limit: int | None = None) -> str:
        return text(self.get(key), self._name(self._path(key)), limit)

    def optional_text(self, key: str, limit: int | None = None) -> str | None:
        return None if self.get(key) is None else self.text(key, limit)

    def whole(self, key: str, low: int = 0, high: int = MAX_WHOLE) -> int:
        return whole_number(self.get(key), self._name(self._path(key)), low, high)

    def optional_whole(self, key: str, low: int = 0, high: int = MAX_WHOLE) -> int | None:
        return None if self.get(key) is None else self.whole(key, low, high)

    def number(self, key: str, low: float = -math.inf, high: float = math.inf) -> float:
        return finite_number(self.get(key), self._name(self._path(key)), low, high)

    def unbounded(self, key: str, low: float = -math.inf) -> float:
        """A number, or null for one JSON cannot hold (`json_numbers.finite_or_null`
        writes infinity so): only null reads as infinity, never Infinity itself."""
        return math.inf if self.get(key) is None else self.number(key, low)

    def flag(self, key: str) -> bool:
        return flag(self.get(key), self._name(self._path(key)))

    def _items(self, key: str, limit: int) -> list[tuple[str, Any]]:
        """A list field's entries, each with its own path (`shape_a[1]`)."""
        items = json_list(self.get(key), self._name(self._path(key)), limit)
        return [(f"{self._path(key)}[{n}]", item) for n, item in enumerate(items)]

    def optional_record(self, key: str) -> Fields | None:
        """An object field read as Fields of its own, or None for null."""
        value = self.get(key)
        return None if value is None else type(self)(value, self.where, self._path(key))

    def records(self, key: str, limit: int) -> list[Fields]:
        """The objects of a list field, each read as Fields of its own."""
        return [type(self)(item, self.where, path) for path, item in self._items(key, limit)]

    def texts(self, key: str, limit: int, each: int | None = None) -> list[str]:
        return [text(item, self._name(path), each) for path, item in self._items(key, limit)]

    def wholes(self, key: str, limit: int, low: int = 0, high: int = MAX_WHOLE) -> list[int]:
        return [
            whole_number(item, self._name(path), low, high)
            for path, item in self._items(key, limit)
        ]

    def numbers(
        self, key: str, limit: int, low: float = -math.inf, high: float = math.inf
    ) -> list[float]:
        return [
            finite_number(item, self._name(path), low, high)
            for path, item in self._items(key, limit)
        ]
