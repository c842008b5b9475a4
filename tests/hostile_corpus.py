"""A corpus of hostile and damaged session files, made from the recorded session.

Each case is a file a reader may be handed: a field of the wrong type, a number out of
range, JSON nested 100,000 deep, a line of 10 MB, binary garbage, a file cut mid-line,
escape sequences aimed at a terminal in every text a reader shows. Its expectation
says what a reader must make of it: load it ("ok"), load what comes before the line it
ends inside ("cut"), or refuse it with one line ("bad").
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FIXTURE = Path(__file__).parent / "data" / "ubatch-roman-empire.jsonl"
ESCAPES = (
    "\x1b]52;c;aGk=\x07"  # OSC 52: write the clipboard
    "\x1b]0;pwned\x07"  # OSC 0: set the window title
    "\x1b[2J\x1b[31m"  # CSI: clear the screen, red
    "\x9b1m"  # C1 CSI
    "\x07\x7f\x00\r\u202e"  # BEL, DEL, NUL, carriage return, right-to-left override
)
"""What a shared file might hold to act on the terminal of whoever reads it."""
SERVER_PROPS = {"speculative": {ESCAPES: ESCAPES}, "slots": [{"id": ESCAPES}], "n_batch": -1}
"""llama-server's /props and /slots as a session header keeps them, every text hostile."""
CONTROL = {
    "fork_index": 1,
    "fork_margins": [0.5, None],
    "generated": 8,
    "output_sha256": "0" * 64,
    "stop_reason": "length",
    "error": None,
}
"""A footer's noise-floor control (lane a run again), as `run --control` writes it."""
WRONG_VALUES: tuple[Any, ...] = ([1], {"x": 1}, "x", -1)
DEEP = 100_000


@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[[], bytes]
    expect: str
    """ok, cut or bad."""


def _records() -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    records = [json.loads(line) for line in FIXTURE.read_text(encoding="utf-8").splitlines()]
    return records[0], records[1:-1], records[-1]


HEADER, STEPS, FOOTER = _records()


def dump(records: list[Any]) -> bytes:
    text = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
    return text.encode("utf-8", "surrogatepass")


def whole() -> bytes:
    return dump([HEADER, *STEPS, FOOTER])


def with_header(edit: Callable[[dict[str, Any]], None]) -> Callable[[], bytes]:
    def make() -> bytes:
        header = copy.deepcopy(HEADER)
        edit(header)
        return dump([header, *STEPS, FOOTER])

    return make


def with_footer(edit: Callable[[dict[str, Any]], None]) -> Callable[[], bytes]:
    def make() -> bytes:
        footer = copy.deepcopy(FOOTER)
        edit(footer)
        return dump([HEADER, *STEPS, footer])

    return make


def with_steps(edit: Callable[[list[dict[str, Any]]], None]) -> Callable[[], bytes]:
    def make() -> bytes:
        steps = copy.deepcopy(STEPS)
        edit(steps)
        return dump([HEADER, *steps, FOOTER])

    return make


def setting(*path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """Set a value at a key path, e.g. setting("executed", "a", "n_ctx", value=...)."""

    def edit(record: dict[str, Any]) -> None:
        target = record
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return edit


def removing(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda record: record.pop(key, None)


def _grade(**fields: Any) -> dict[str, Any]:
    """A lane's grade in a footer, with the given fields replaced."""
    return {"passed": True, "reason": "passed", "grader": "tests", **fields}


def _wrong_types(kind: str, record: dict[str, Any], editor: Any) -> list[Case]:
    """Every field of a header or footer given each wrong value, and left out. Whether a
    value is wrong depends on the field, so the loader's verdict is only held to
    'loads or refuses with one line' here: the typed records' own tests say which."""
    cases = []
    for key in record:
        for number, value in enumerate(WRONG_VALUES):
            cases.append(Case(f"{kind}-{key}-wrong{number}", editor(setting(key, value=value)), ""))
        cases.append(Case(f"{kind}-{key}-missing", editor(removing(key)), ""))
    return cases


def _escape_cases() -> list[Case]:
    def every_piece(steps: list[dict[str, Any]]) -> None:
        for step in steps:
            step["piece"] = ESCAPES
            for candidate in step["top"]:
                candidate[2] = ESCAPES

    def lane_key(header: dict[str, Any]) -> None:
        header["lanes"][ESCAPES] = header["lanes"]["a"]
        header["executed"][ESCAPES] = {ESCAPES: ESCAPES}

    fields = [
        ("prompt", setting("prompt", value=ESCAPES)),
        ("pair", setting("pair", value=ESCAPES)),
        ("description", setting("description", value=ESCAPES)),
        ("created", setting("created", value=ESCAPES)),
        ("stop", setting("stop", value=[ESCAPES])),
        ("label", setting("lanes", "a", "label", value=ESCAPES)),
        ("lane-key", lane_key),
        ("model-path", setting("executed", "a", "model_path", value=ESCAPES)),
        ("model-sha", setting("executed", "b", "model_sha256", value=ESCAPES)),
        ("executed-extra", setting("executed", "a", ESCAPES, value={"k": [ESCAPES]})),
        ("device", setting("executed", "a", "devices", value=[{"name": ESCAPES, "type": ESCAPES}])),
        ("split-mode", setting("executed", "b", "split_mode", value=ESCAPES)),
        ("served-by", setting("executed", "a", "served_by", value=ESCAPES)),
        ("server-props", setting("executed", "a", "server", value=SERVER_PROPS)),
        (
            "rescoring-reasons",
            setting("executed", "a", "rescoring", value={"skipped": 2, "reasons": [ESCAPES]}),
        ),
        ("cpu", setting("build", "cpu", value=ESCAPES)),
        ("system-info", setting("build", "system_info", value=ESCAPES + " AVX2 = 1 |")),
        ("build-extra", setting("build", ESCAPES, value=ESCAPES)),
    ]
    cases = [Case(f"escapes-{name}", with_header(edit), "ok") for name, edit in fields]
    cases.append(Case("escapes-pieces", with_steps(every_piece), "ok"))
    cases.append(Case("escapes-error", with_footer(setting("errors", value=[ESCAPES, None])), "ok"))
    cases.append(
        Case(
            "escapes-grade",
            with_footer(setting("grades", value=[_grade(reason=ESCAPES)] * 2)),
            "ok",
        )
    )
    cases.append(
        Case("escapes-stop-reason", with_footer(setting("stop_reasons", value=[ESCAPES] * 2)), "ok")
    )
    # a control cut short before the fork names its stop reason; one that failed, its error
    for key, value in (("stop_reason", ESCAPES), ("error", ESCAPES), ("label", ESCAPES)):
        control = CONTROL | {"fork_index": None, "generated": 0, key: value}
        cases.append(
            Case(f"escapes-control-{key}", with_footer(setting("control", value=control)), "ok")
        )
    return cases


def _step_cases() -> list[Case]:
    def at(index: int, *path: Any, value: Any) -> Callable[[list[dict[str, Any]]], None]:
        def edit(steps: list[dict[str, Any]]) -> None:
            target = steps[index]
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value

        return edit

    def logit_above_normaliser(steps: list[dict[str, Any]]) -> None:
        steps[22]["top"][0][1] = 1000.0
        steps[22]["logsumexp"] = 0.0

    def hex_piece(text: str) -> Callable[[list[dict[str, Any]]], None]:
        def edit(steps: list[dict[str, Any]]) -> None:
            del steps[2]["piece"]
            steps[2]["piece_hex"] = text

        return edit

    ok = [
        ("logit-above-normaliser", logit_above_normaliser),
        ("piece-hex", hex_piece("e282ff")),
        ("extra-step-field", at(5, "extra", value={"a": [ESCAPES]})),
        ("source-escapes", at(5, "source", value=ESCAPES)),
    ]
    bad = [
        ("lane-c", at(1, "lane", value="c")),
        ("negative-id", at(1, "token_id", value=-4)),
        ("negative-index", at(1, "index", value=-1)),
        ("huge-index", at(1, "index", value=10**30)),
        ("index-gap", at(1, "index", value=7)),
        ("huge-id", at(1, "token_id", value=10**40)),
        ("huge-logit", at(3, "top", 0, 1, value=1e300)),
        ("top-empty", at(3, "top", value=[])),
        ("top-huge", at(3, "top", value=[[1, 0.5, "x"]] * 5000)),
        ("top-not-triples", at(3, "top", value=[[1, 0.5]])),
        ("piece-number", at(3, "piece", value=5)),
        ("piece-hex-bad", hex_piece("zz")),
        ("piece-hex-odd", hex_piece("abc")),
        ("probes-huge", at(3, "probes", value=[[1, 0.5, 2]] * 5000)),
        # a 3 MB token fits a line but stalled the replay's drawing for minutes
        ("piece-giant", at(3, "piece", value="x" * 3_000_000)),
        ("piece-hex-giant", hex_piece("ab" * 5000)),
        ("candidate-piece-giant", at(3, "top", 0, 2, value="y" * 5000)),
        ("timestamp-text", at(3, "timestamp", value="now")),
        ("verify-width-zero", at(3, "verify_width", value=0)),
        ("source-number", at(3, "source", value=5)),
        ("source-giant", at(3, "source", value="x" * 5000)),
    ]
    return [Case(f"step-{name}", with_steps(edit), "ok") for name, edit in ok] + [
        Case(f"step-{name}", with_steps(edit), "bad") for name, edit in bad
    ]


def _literal(text: bytes, old: bytes, new: bytes) -> bytes:
    assert old in text
    return text.replace(old, new, 1)


def _structure_cases() -> list[Case]:
    first_logit = str(STEPS[0]["top"][0][1]).encode()
    first_time = str(STEPS[0]["timestamp"]).encode()
    nested = b"[" * DEEP + b"]" * DEEP
    bad = {
        "empty": lambda: b"",
        "blank-lines": lambda: b"\n\n\n",
        "binary-garbage": lambda: bytes(range(256)) * 64,
        "not-utf8": lambda: _literal(whole(), b"Roman", b"R\xffman"),
        "nan-logit": lambda: _literal(whole(), first_logit, b"NaN"),
        "infinite-timestamp": lambda: _literal(whole(), first_time, b"Infinity"),
        "minus-infinity-logit": lambda: _literal(whole(), first_logit, b"-Infinity"),
        "huge-exponent": lambda: _literal(whole(), first_logit, b"1e999999"),
        "two-headers": lambda: dump([HEADER, HEADER, *STEPS, FOOTER]),
        "footer-before-steps": lambda: dump([HEADER, FOOTER, *STEPS]),
        "two-footers": lambda: dump([HEADER, *STEPS, FOOTER, FOOTER]),
        "steps-only": lambda: dump([*STEPS, FOOTER]),
        "unknown-record": lambda: dump([HEADER, {"type": "chapter"}, *STEPS]),
        "json-array-line": lambda: dump([HEADER, [1, 2, 3], *STEPS]),
        "deep-header": lambda: b'{"type":"header","build":' + nested + b"}\n",
        "deep-step": lambda: dump([HEADER, *STEPS[:4]]) + b'{"type":"step","x":' + nested + b"}\n",
        "deep-footer": lambda: dump([HEADER, *STEPS]) + b'{"type":"footer","x":' + nested + b"}\n",
        "deep-build": with_header(setting("build", "x", value=json.loads("[" * 40 + "]" * 40))),
        "ten-mb-line": lambda: dump([HEADER]) + b'{"type":"step","x":"' + b"a" * 10**7 + b'"}\n',
        "ten-mb-last-line": lambda: dump([HEADER]) + b"a" * 10**7,
        "prompt-ids-too-many": with_header(setting("prompt_token_ids", value=[1] * 1_100_000)),
        "prompt-id-negative": with_header(setting("prompt_token_ids", value=[1, -2])),
        "max-tokens-huge": with_header(setting("max_tokens", value=10**30)),
        "stop-as-text": with_header(setting("stop", value="abc")),
        "executed-model-size-list": with_header(setting("executed", "a", "model_size", value=[1])),
        "executed-n-ctx-text": with_header(setting("executed", "a", "n_ctx", value="x")),
        "executed-sha-number": with_header(setting("executed", "a", "model_sha256", value=5)),
        "executed-devices-text": with_header(setting("executed", "a", "devices", value="CPU")),
        "executed-device-number": with_header(setting("executed", "a", "devices", value=[7])),
        "executed-device-memory-text": with_header(
            setting("executed", "b", "devices", value=[{"memory_total": "24 GB"}])
        ),
        "executed-gpu-layers-all": with_header(setting("executed", "a", "gpu_layers", value="all")),
        "executed-gpu-offload-text": with_header(
            setting("executed", "b", "gpu_offload", value="no")
        ),
        "executed-offloaded-negative": with_header(
            setting("executed", "a", "layers_offloaded", value=-1)
        ),
        "executed-served-by-number": with_header(setting("executed", "a", "served_by", value=8)),
        "executed-retries-negative": with_header(setting("executed", "b", "retries", value=-1)),
        "executed-waited-text": with_header(
            setting("executed", "a", "waited_seconds", value="1.5 s")
        ),
        "executed-restartable-text": with_header(
            setting("executed", "b", "restartable", value="yes")
        ),
        "executed-rescoring-text": with_header(
            setting("executed", "a", "rescoring", value="2 skipped")
        ),
        "executed-rescoring-skipped-negative": with_header(
            setting("executed", "b", "rescoring", value={"skipped": -1})
        ),
        "executed-rescoring-reasons-number": with_header(
            setting("executed", "a", "rescoring", value={"reasons": [7]})
        ),
        "build-system-info-object": with_header(setting("build", "system_info", value={"a": 1})),
        "lane-bad-backend": with_header(setting("lanes", "a", "backend", value=ESCAPES)),
        "lane-server-flags-escapes": with_header(
            setting("lanes", "a", "server_flags", value=ESCAPES)
        ),
        "lane-rescore-unknown": with_header(setting("lanes", "b", "rescore", value="always")),
        "lane-unknown-key": with_header(setting("lanes", "b", ESCAPES, value=1)),
        "footer-speed-list": with_footer(setting("tokens_per_second", value=[[1], [2]])),
        "footer-speed-negative": with_footer(setting("tokens_per_second", value=[-1, 2])),
        "footer-generated-three": with_footer(setting("generated", value=[1, 2, 3])),
        "footer-grades-one": with_footer(setting("grades", value=[None])),
        "footer-grade-passed-number": with_footer(
            setting("grades", value=[_grade(passed=1), None])
        ),
        "footer-grade-unknown-grader": with_footer(
            setting("grades", value=[_grade(grader="x")] * 2)
        ),
        "footer-grade-reason-huge": with_footer(
            setting("grades", value=[_grade(reason="r" * 10**5)] * 2)
        ),
        "footer-grade-reason-list": with_footer(
            setting("grades", value=[None, _grade(reason=[1])])
        ),
        "footer-fork-class-unknown": with_footer(setting("fork_class", value=ESCAPES)),
        "footer-fork-class-list": with_footer(setting("fork_class", value=["near tie"])),
        "footer-near-tie-text": with_footer(setting("near_tie", value="0.5")),
        "footer-near-tie-negative": with_footer(setting("near_tie", value=-1)),
        "footer-near-tie-huge": with_footer(setting("near_tie", value=1e300)),
        "footer-serving-one": with_footer(setting("serving", value=[None])),
        "footer-serving-text": with_footer(setting("serving", value=["http://a:1", None])),
        "footer-serving-endpoint-number": with_footer(
            setting("serving", value=[{"endpoint": 5}, None])
        ),
        "footer-serving-endpoint-huge": with_footer(
            setting("serving", value=[{"endpoint": "h" * 10**5}, None])
        ),
        "footer-serving-retries-negative": with_footer(
            setting("serving", value=[{"endpoint": "http://a:1", "retries": -1}, None])
        ),
        "footer-serving-retries-bool": with_footer(
            setting("serving", value=[{"endpoint": "http://a:1", "retries": True}, None])
        ),
        "footer-serving-wait-text": with_footer(
            setting("serving", value=[None, {"endpoint": "http://a:1", "wait_seconds": "1"}])
        ),
        "footer-serving-wait-nan": with_footer(
            setting("serving", value=[None, {"endpoint": "http://a:1", "wait_seconds": math.nan}])
        ),
        "footer-control-text": with_footer(setting("control", value="noise floor")),
        "footer-control-fork-text": with_footer(
            setting("control", value=CONTROL | {"fork_index": "1"})
        ),
        "footer-control-generated-missing": with_footer(
            setting("control", value={k: v for k, v in CONTROL.items() if k != "generated"})
        ),
        "footer-control-generated-negative": with_footer(
            setting("control", value=CONTROL | {"generated": -1})
        ),
        "footer-control-margins-nan": with_footer(
            setting("control", value=CONTROL | {"fork_margins": [math.nan, 1.0]})
        ),
        "footer-control-sha-number": with_footer(
            setting("control", value=CONTROL | {"output_sha256": 5})
        ),
        "footer-control-error-list": with_footer(
            setting("control", value=CONTROL | {"error": [ESCAPES]})
        ),
    }
    ok = {
        "bom": lambda: b"\xef\xbb\xbf" + whole(),
        "crlf": lambda: whole().replace(b"\n", b"\r\n"),
        "blank-line-between": lambda: _literal(whole(), b"}\n", b"}\n\n"),
        "no-footer": lambda: dump([HEADER, *STEPS[:57]]),
        "header-only": lambda: dump([HEADER]),
        "extra-fields": with_header(setting("future", value={"a": [1, {"b": ESCAPES}]})),
        "fork-index-out-of-range": with_footer(setting("fork_index", value=999)),
        "footer-lies-identical": with_footer(setting("identical", value=True)),
        "huge-speeds": with_footer(setting("tokens_per_second", value=[1e300, 1e-300])),
        "lane-keys-extra": with_header(setting("lanes", "c", value={"backend": 5})),
        "footer-near-tie": with_footer(setting("near_tie", value=0.9)),
        "footer-fork-class-unscored": with_footer(setting("fork_class", value="unscored")),
        "footer-serving": with_footer(
            setting(
                "serving", value=[{"endpoint": ESCAPES, "retries": 3, "wait_seconds": 2.5}, None]
            )
        ),
    }
    return [Case(f"file-{name}", make, "bad") for name, make in bad.items()] + [
        Case(f"file-{name}", make, "ok") for name, make in ok.items()
    ]


def _cut_cases() -> list[Case]:
    """A file cut short: by a full disk, a crash mid-write, a copy that stopped."""

    def cut_at(fraction: float) -> Callable[[], bytes]:
        def make() -> bytes:
            data = whole()
            header_end = data.index(b"\n") + 1
            position = header_end + int((len(data) - header_end) * fraction)
            # never at a line's end: the file must end inside a line
            while data[position - 1 : position] == b"\n":
                position += 1
            return data[:position]

        return make

    cases = [Case(f"cut-{fraction}", cut_at(fraction), "cut") for fraction in (0.0, 0.3, 0.5, 0.9)]
    cases.append(Case("cut-inside-footer", lambda: whole()[:-20], "cut"))
    cases.append(
        Case("cut-inside-a-character", lambda: dump([HEADER, *STEPS[:5]]) + b'"\xe2\x82', "cut")
    )
    cases.append(Case("cut-inside-header", lambda: whole()[:300], "bad"))
    cases.append(Case("header-without-newline", lambda: dump([HEADER])[:-1], "ok"))
    odd_lane = {**STEPS[4], "lane": ["a"]}  # unhashable: the listing's tail read met it
    cases.append(
        Case("partial-step-lane-list", lambda: dump([HEADER, *STEPS[:4], odd_lane]), "bad")
    )
    cases.append(Case("partial-ends-with-a-list", lambda: dump([HEADER, *STEPS[:4], [1]]), "bad"))
    cases.append(
        Case(
            "cut-after-crlf-step",
            lambda: dump([HEADER, *STEPS[:3]]).replace(b"\n", b"\r\n") + b'{"ty',
            "cut",
        )
    )
    return cases


def _chat_cases() -> list[Case]:
    """A chat session's conversation and formatted prompts: escapes shown, wrong types
    refused (a NUL cannot pass a template, so the conversation's escapes leave it out)."""
    said = ESCAPES.replace("\x00", "")
    ok = [
        ("messages", [{"role": "system", "content": said}, {"role": "user", "content": said}]),
        ("lane_prompts", {"a": {"text": ESCAPES, "token_ids": [2, 105]}}),
    ]
    bad = {
        "messages-empty": [],
        "messages-role": [{"role": ESCAPES, "content": "x"}],
        "messages-content": [{"role": "user", "content": 5}],
        "messages-extra-key": [{"role": "user", "content": "x", "name": "x"}],
        "messages-nul": [{"role": "user", "content": "a\x00b"}],
        "lane_prompts-lane": {"c": {"text": "", "token_ids": []}},
        "lane_prompts-text": {"a": {"text": 1, "token_ids": []}},
        "lane_prompts-id": {"b": {"text": "", "token_ids": [-1]}},
    }
    cases = [Case(f"chat-{key}-escapes", with_header(setting(key, value=v)), "ok") for key, v in ok]
    template = setting("executed", "a", "chat_template", value=ESCAPES)
    cases.append(Case("chat-template-escapes", with_header(template), "ok"))
    for name, value in bad.items():
        key = name.partition("-")[0]
        cases.append(Case(f"chat-{name}", with_header(setting(key, value=value)), "bad"))
    return cases


def corpus() -> list[Case]:
    return [
        *_chat_cases(),
        *_wrong_types("header", HEADER, with_header),
        *_wrong_types("footer", FOOTER, with_footer),
        *_escape_cases(),
        *_step_cases(),
        *_structure_cases(),
        *_cut_cases(),
    ]
