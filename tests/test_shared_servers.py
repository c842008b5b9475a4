"""A shared session file names its lanes, server lanes included: re-running them would
send the prompt to whatever endpoint the file names, with the key from whatever variable
it names. verify and the replay's run refuse that unless the user passes --allow-servers."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from specdiff.cli.replay import open_for_replay, replay_app
from tests.conftest import wait_for
from tests.tui_driver import drive

SESSION = Path(__file__).parent / "data" / "ubatch-roman-empire.jsonl"
SECRET = "ghp_not_for_strangers"


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A real socket on loopback that counts who connects: the endpoint a file names."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        server.settimeout(0.5)
        yield server


def contacted(server: socket.socket) -> bool:
    try:
        connection, _ = server.accept()
    except TimeoutError:
        return False
    connection.close()
    return True


def session_naming(server: socket.socket, folder: Path, lanes: str = "a") -> Path:
    """The test session with `lanes` turned into server lanes at the listener."""
    records = [json.loads(line) for line in SESSION.read_text(encoding="utf-8").splitlines()]
    port = server.getsockname()[1]
    for lane_id in lanes:
        records[0]["lanes"][lane_id].update(
            backend="server",
            endpoint=f"http://user:pw@127.0.0.1:{port}",
            api_key_env="SPECDIFF_TEST_SECRET",
            timeout=2,
            retries=0,
        )
    path = folder / "shared.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def verify(path: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "specdiff", "verify", "--quiet", str(path), *extra],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "SPECDIFF_TEST_SECRET": SECRET},
    )


@pytest.mark.parametrize("lanes", ["a", "b", "ab"])
def test_verify_contacts_no_server_a_file_names_without_allow_servers(
    tmp_path: Path, listener: socket.socket, lanes: str
) -> None:
    completed = verify(session_naming(listener, tmp_path, lanes))
    assert completed.returncode == 2, completed.stderr
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in completed.stderr
    assert "names server lanes" in lines[0] and "--allow-servers" in lines[0]
    assert "$SPECDIFF_TEST_SECRET" in lines[0]  # the user sees which variable it wanted
    assert "pw@" not in lines[0] and SECRET not in completed.stderr + completed.stdout
    assert not contacted(listener)


@pytest.mark.model
def test_verify_with_allow_servers_does_contact_the_server(
    tmp_path: Path, listener: socket.socket
) -> None:
    completed = verify(session_naming(listener, tmp_path, "ab"), "--allow-servers")
    assert contacted(listener)
    assert completed.returncode != 0  # the listener never answers a request
    assert SECRET not in completed.stderr + completed.stdout


async def test_the_replay_shows_a_shared_server_session_but_never_runs_it(
    tmp_path: Path, listener: socket.socket
) -> None:
    session, stream = open_for_replay(session_naming(listener, tmp_path))
    args = argparse.Namespace(
        instant=True, speed=1.0, theme=None, allow_servers=False, pause_at_fork=False
    )
    app = replay_app(session, stream, args)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: len(drive(app).lanes["a"].steps) == 60, 30)
        await pilot.press("r")  # a replay asks before it is replaced
        await pilot.press("r")
        await wait_for(pilot, lambda: "names server lanes" in app.query_one("#status").plain)
        assert not drive(app).running
    stream.close()
    assert not contacted(listener)
    # the steps shown are the file's: refusing the run threw nothing away
    assert len(drive(app).lanes["a"].steps) == 60
