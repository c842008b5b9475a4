"""Suites under hostile conditions: a session file in the report folder that cannot be
read (corrupt, cut short, holding a value a reader rejects) fails only its own run and
is run again by --resume; a suite in which no run can execute says why and exits 1; a
suite.json holding a value no run could use is refused in one line."""

from __future__ import annotations

import json
import resource
import shutil
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from specdiff.cli import main
from specdiff.lanes import Lane, Pair, presets
from specdiff.sessions.store import load_session
from specdiff.suite.folder import REPORT_FILES, SUITE_FILE, write_settings
from specdiff.suite.prompts import SuitePrompt
from specdiff.suite.settings import SuiteSettings
from tests.test_shared_servers import contacted, listener  # noqa: F401 - a fixture

TOKENS = 3
PROMPTS = [
    {"id": "first", "prompt": "def add(a, b):"},
    {"id": "second", "prompt": "The capital of France is"},
]


def report_json(folder: Path) -> dict:
    return json.loads((folder / "report.json").read_text(encoding="utf-8"))


def no_traceback_and_one_line_each(err: str) -> None:
    assert "Traceback" not in err, err
    assert all(ord(c) >= 0x20 or c in "\n\t" for c in err if c != "\r"), repr(err)


@pytest.fixture(scope="module")
def finished_suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small suite that ran to the end: two prompts under ubatch, three tokens."""
    root = tmp_path_factory.mktemp("hostile-suite")
    prompts = root / "two.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS), encoding="utf-8")
    folder = root / "report"
    arguments = ["suite", str(prompts), "--pair", "ubatch", "--report", str(folder)]
    assert main([*arguments, "--max-tokens", str(TOKENS), "--quiet"]) == 0
    return folder


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def replace_line(number: int, text: bytes) -> Callable[[Path], None]:
    def corrupt(path: Path) -> None:
        lines = lines_of(path)
        lines[number] = text + b"\n"
        path.write_bytes(b"".join(lines))

    return corrupt


def cut_inside_last_line(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - len(lines_of(path)[-1]) // 2])


def without_footer(path: Path) -> None:
    path.write_bytes(b"".join(lines_of(path)[:-1]))


def with_nan_logit(path: Path) -> None:
    lines = lines_of(path)
    step = json.loads(lines[1])
    step["top"][1][1] = float("nan")
    lines[1] = json.dumps(step).encode() + b"\n"  # json writes NaN bare, as a server's would be
    path.write_bytes(b"".join(lines))


def repeated_step(path: Path) -> None:
    lines = lines_of(path)
    path.write_bytes(b"".join([*lines[:2], lines[1], *lines[2:]]))


CORRUPTIONS: dict[str, Callable[[Path], None]] = {
    "empty file": lambda path: path.write_bytes(b""),
    "not UTF-8": lambda path: path.write_bytes(b"\xff\xfe\x00garbage\n"),
    "invalid JSON step": replace_line(1, b"{not json"),
    "JSON nested 100,000 deep": replace_line(
        1, b'{"type": "step", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    ),
    "header not an object": replace_line(0, b"[1, 2, 3]"),
    "NaN logit": with_nan_logit,
    "step repeated": repeated_step,
    "cut inside the footer": cut_inside_last_line,
    "footer lost": without_footer,
}


@pytest.mark.model
@pytest.mark.parametrize("name", CORRUPTIONS)
def test_an_unreadable_session_is_run_again_on_resume(
    finished_suite: Path, tmp_path: Path, name: str, capsys
) -> None:
    folder = tmp_path / "report"
    shutil.copytree(finished_suite, folder)
    sessions = sorted((folder / "sessions" / "ubatch").glob("*.jsonl"))
    assert len(sessions) == len(PROMPTS)
    damaged, intact = sessions
    intact_mtime = intact.stat().st_mtime_ns
    CORRUPTIONS[name](damaged)
    capsys.readouterr()

    code = main(["suite", "--resume", "--report", str(folder)])
    captured = capsys.readouterr()
    no_traceback_and_one_line_each(captured.err)
    assert code == 0, captured.err
    again_lines = [line for line in captured.err.splitlines() if " again: " in line]
    assert len(again_lines) == 1 and again_lines[0].startswith("running ubatch"), captured.err
    data = report_json(folder)
    assert data["complete"] and data["finished"] == 2 and data["resumed"] == 1
    assert data["pairs"][0]["summary"]["failed"] == 0
    session = load_session(damaged)  # replaced by a fresh run
    assert session.footer is not None and len(session.steps["a"]) == TOKENS
    assert intact.stat().st_mtime_ns == intact_mtime


def text_file(path: Path) -> None:
    path.write_text("just some notes, not a model\n", encoding="utf-8")


def cut_gguf(path: Path) -> None:
    path.write_bytes(b"GGUF" + struct.pack("<I", 3) + b"\x01\x00")


def gguf_with_a_duplicated_token(path: Path) -> None:
    tokens = [b"a", b"b", b"a"]
    key = b"tokenizer.ggml.tokens"
    entry = struct.pack("<Q", len(key)) + key + struct.pack("<IIQ", 9, 8, len(tokens))
    entry += b"".join(struct.pack("<Q", len(t)) + t for t in tokens)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + entry + b"\0" * 64)


UNLOADABLE_MODELS: dict[str, Callable[[Path], None]] = {
    "a text file": text_file,
    "an empty file": lambda path: path.write_bytes(b""),
    "a GGUF cut in its header": cut_gguf,
    "a vocabulary with one token twice": gguf_with_a_duplicated_token,
}


@pytest.mark.parametrize("name", UNLOADABLE_MODELS)
def test_a_suite_where_no_model_loads_exits_1_with_the_reason(
    tmp_path: Path, name: str, capsys
) -> None:
    model = tmp_path / "model.gguf"
    UNLOADABLE_MODELS[name](model)
    folder = tmp_path / "report"
    code = main(
        ["suite", "coding", "--pair", "ubatch", "--model", str(model), "--report", str(folder)]
    )
    captured = capsys.readouterr()
    no_traceback_and_one_line_each(captured.err)
    assert code == 1, captured.err
    last = captured.err.strip().splitlines()[-1]
    assert last.startswith("specdiff: no run of the suite finished: ubatch: ")
    assert str(model) in last
    assert "identical 0 of 0" not in captured.out
    assert "ubatch: no run finished" in captured.out
    assert not report_json(folder)["prompts"]


def write_suite_json(folder: Path, pair: Pair | None = None, **changed: object) -> None:
    settings = SuiteSettings("two", (pair or presets()["ubatch"],), TOKENS)
    prompts = [SuitePrompt(id=p["id"], prompt=p["prompt"], where=p["id"]) for p in PROMPTS]
    folder.mkdir()
    write_settings(folder, settings, prompts)
    stored = json.loads((folder / SUITE_FILE).read_text(encoding="utf-8"))
    stored.update(changed)
    (folder / SUITE_FILE).write_text(json.dumps(stored), encoding="utf-8")


@pytest.mark.parametrize(
    "changed",
    [
        {"near_tie": float("nan")},
        {"near_tie": float("inf")},
        {"near_tie": -1},
        {"near_tie": "0.5"},
        {"max_tokens": 0},
        {"max_tokens": [3]},
        {"pairs": "ubatch"},
        {"pairs": [["ubatch"]]},
        {"stop": "abc"},
        {"quants": [1]},
        {"teacher_forced": "yes"},
    ],
    ids=repr,
)
def test_a_suite_json_no_run_could_use_is_refused_in_one_line(
    tmp_path: Path, changed: dict, capsys
) -> None:
    folder = tmp_path / "report"
    write_suite_json(folder, **changed)
    code = main(["suite", "--resume", "--report", str(folder)])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("specdiff: error: "), err
    assert SUITE_FILE in err


def test_a_suite_json_nested_too_deep_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "report"
    folder.mkdir()
    (folder / SUITE_FILE).write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    code = main(["suite", "--resume", "--report", str(folder)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and SUITE_FILE in err, err


SERVER_LANES = {
    "lane a": ("a", "", "SPECDIFF_SUITE_KEY", False),
    "lane b": ("b", "", "", False),
    "lane a with a password": ("a", "specdiff:password-0123456789@", "", False),
    "lane a with a password, allowed": ("a", "specdiff:password-0123456789@", "", True),
    "lane b with a token, allowed": ("b", "token-0123456789abcdef@", "SPECDIFF_SUITE_KEY", True),
}
"""Which lane of the stored pair talks to a server, the credentials its endpoint was
given (suite.json keeps them as ***), the key variable it names, and whether the resume
passes --allow-servers (never for plain endpoints here: that one would run)."""


@pytest.mark.parametrize(
    "side, credentials, key_env, allow", SERVER_LANES.values(), ids=SERVER_LANES
)
def test_a_resume_from_suite_json_contacts_no_server_it_names_without_leave(
    tmp_path: Path,
    listener: socket.socket,  # noqa: F811 - the fixture imported above
    side: str,
    credentials: str,
    key_env: str,
    allow: bool,
    capsys,
) -> None:
    """suite.json picks the endpoints and key variables, as a session file does: a
    resume without PROMPTS re-runs its server lanes only with --allow-servers, and never
    one whose credentials were saved as ***, which would be sent as the password."""
    port = listener.getsockname()[1]
    server = Lane(
        backend="server", endpoint=f"http://{credentials}127.0.0.1:{port}", api_key_env=key_env
    )
    plain = presets()["ubatch"]
    lanes = (server, plain.b) if side == "a" else (plain.a, server)
    folder = tmp_path / "report"
    write_suite_json(folder, Pair("shared", *lanes))
    stored = (folder / SUITE_FILE).read_text(encoding="utf-8")
    assert (credentials == "") == ("***@" not in stored)
    code = main(["suite", "--resume", "--report", str(folder), *(["--allow-servers"] * allow)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("specdiff: error: ") and SUITE_FILE in err, err
    if credentials:
        assert f"lane {side}: the endpoint http://***@127.0.0.1:{port}" in err, err
        assert "saved without its credentials" in err and f"--lane-{side} endpoint=" in err
    else:
        assert "--allow-servers" in err and f"127.0.0.1:{port}" in err, err
        assert (f"${key_env}" in err) == bool(key_env), err
    assert not contacted(listener)
    assert not list(folder.glob("report.*")) and not (folder / "sessions").exists()


@pytest.mark.model
def test_a_report_that_does_not_fit_is_one_line_and_leaves_no_temporary_file(
    finished_suite: Path, tmp_path: Path
) -> None:
    """The report files are written last: a file-size limit (RLIMIT_FSIZE, as a full disk
    would) below the largest of them fails that one, after the session files were read
    back; the old file of that name stays."""
    folder = tmp_path / "report"
    shutil.copytree(finished_suite, folder)
    before = sorted(p.relative_to(folder) for p in folder.rglob("*"))
    limit = 2 * (folder / SUITE_FILE).stat().st_size  # suite.json is written again first
    assert max((folder / name).stat().st_size for name in REPORT_FILES) > 2 * limit

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails, EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    run = subprocess.run(
        [sys.executable, "-m", "specdiff", "suite", "--resume", "--report", str(folder)],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=limited,
    )
    assert run.returncode == 1, run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("specdiff: error: cannot write ") and "Traceback" not in run.stderr
    assert sorted(p.relative_to(folder) for p in folder.rglob("*")) == before


@pytest.mark.model
def test_a_suite_where_every_run_crashes_exits_1_with_the_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    from specdiff.engine.faults import FAULT_ENV

    prompts = tmp_path / "two.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS), encoding="utf-8")
    monkeypatch.setenv(FAULT_ENV, "b:1:segv")  # every run dies at its second step
    folder = tmp_path / "report"
    code = main(
        ["suite", str(prompts), "--pair", "ubatch", "--report", str(folder), "--max-tokens", "3"]
    )
    captured = capsys.readouterr()
    no_traceback_and_one_line_each(captured.err)
    assert code == 1, captured.err
    last = captured.err.strip().splitlines()[-1]
    assert last.startswith("specdiff: no run of the suite finished: ubatch first: ")
    assert "SIGSEGV" in last
    assert "ubatch: no run finished, 2 crashed" in captured.out
    assert "identical 0 of 0" not in captured.out
