"""A server lane's endpoints: several per lane, the least busy chosen, back-off on 429
and 503 as the server asks, a request budget, circuit breaking around a dead server,
connections kept alive, and bad endpoint lists refused with one line."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from specdiff.engine.server import pool as pools
from specdiff.engine.server.client import EndpointFailed, ServerClient, ServerError
from specdiff.engine.server.pool import (
    BREAK_AFTER,
    JITTER,
    MAX_WAIT,
    EndpointPool,
    backoff_delay,
    retry_after_seconds,
)
from specdiff.errors import LaneConfigError
from specdiff.lanes import Lane, load_pairs_file, without_credentials
from tests.in_process import specdiff_here
from tests.servers import busy_mode, fault_server, free_port

COMPLETIONS = "/v1/completions"
BODY = {"prompt": "Hi", "max_tokens": 4, "stream": True}


def server_lane(*urls: str, retries: int = 2) -> Lane:
    return Lane(backend="server", endpoint=",".join(urls), retries=retries, timeout=10)


def stream(client: ServerClient) -> list[str]:
    return list(client.stream_lines(COMPLETIONS, BODY, lambda: 0))


# -- choosing ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("loads", "expected"),
    [([0, 0, 0], {0, 1, 2}), ([2, 0, 1], {1}), ([1, 1, 0], {2}), ([3, 2, 2], {1, 2})],
)
def test_the_pool_chooses_the_endpoint_with_the_least_in_flight(
    loads: list[int], expected: set[int]
) -> None:
    urls = [f"http://127.0.0.1:{9000 + i}" for i in range(len(loads))]
    pool = EndpointPool(urls, {}, 5, 0)
    for endpoint, load in zip(pool.endpoints, loads):
        endpoint.in_flight = load
    chosen = set()
    for _ in range(len(urls)):
        endpoint = pool.claim()
        chosen.add(pool.endpoints.index(endpoint))
        pool.unclaim(endpoint)  # back as it was: the next claim sees the same loads
    assert chosen == expected  # ties are taken in turn, so every tied one is chosen


@pytest.mark.parametrize("endpoints", [2, 3])
def test_claims_spread_evenly_and_a_set_aside_endpoint_gets_none(endpoints: int) -> None:
    pool = EndpointPool([f"http://h{i}:1" for i in range(endpoints)], {}, 5, 0)
    for _ in range(BREAK_AFTER):
        pool.failed(pool.endpoints[0], "connection refused")
    held = [pool.claim() for _ in range(4 * (endpoints - 1))]
    counts = [sum(1 for e in held if e is endpoint) for endpoint in pool.endpoints]
    assert counts == [0] + [4] * (endpoints - 1)


# -- back-off --------------------------------------------------------------------------


@pytest.mark.parametrize("retry_after", [0.0, 0.2, 3.0, 59.0, 60.0])
def test_a_retry_after_is_waited_whole_with_bounded_jitter(retry_after: float) -> None:
    delays = [backoff_delay(attempt, retry_after) for attempt in range(5) for _ in range(20)]
    assert min(delays) >= retry_after
    assert max(delays) <= min(retry_after * (1 + JITTER), MAX_WAIT)


@pytest.mark.parametrize("attempt", [0, 1, 3, 20])
def test_without_retry_after_the_back_off_doubles_up_to_the_cap(attempt: int) -> None:
    base = min(pools.BACKOFF_FIRST * 2**attempt, MAX_WAIT)
    delays = [backoff_delay(attempt) for _ in range(50)]
    assert all(min(base, MAX_WAIT) <= d <= min(base * (1 + JITTER), MAX_WAIT) for d in delays)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("3", 3.0),
        (" 1.5 ", 1.5),
        ("-4", 0.0),
        ("86400", MAX_WAIT),
        ("nan", None),
        ("soon", None),
        ("", None),
        (None, None),
        ("Wed, 21 Oct 2015 07:28:10 GMT", 10.0),  # 10 s after `now` below
        ("Wed, 21 Oct 2015 07:27:00 GMT", 0.0),  # a date already past
    ],
)
def test_retry_after_is_read_as_seconds_or_an_http_date(
    header: str | None, expected: float | None
) -> None:
    now = 1445412480.0  # Wed, 21 Oct 2015 07:28:00 GMT
    assert retry_after_seconds(header, now) == expected


# -- the endpoint key ------------------------------------------------------------------


@pytest.mark.parametrize(
    "endpoint",
    ["http://a:1", "http://a:1,http://b:2", "https://u:pw-long-secret@a:1/v, http://b:2/"],
)
def test_an_endpoint_list_keeps_one_string_and_masks_each_credential(endpoint: str) -> None:
    lane = server_lane(endpoint)
    assert lane.endpoint == endpoint  # old sessions and suite.json files read back alike
    assert len(lane.endpoints) == endpoint.count("://")
    assert "pw-long-secret" not in without_credentials(lane.endpoint)
    assert "pw-long-secret" not in lane.as_dict()["endpoint"]
    assert without_credentials(lane.endpoint).count("://") == len(lane.endpoints)


@pytest.mark.parametrize(
    ("endpoint", "words"),
    [
        ("", "needs endpoint=http"),
        ("localhost:8080", "is not a URL"),
        ("http://a:1,ftp://b:2", "is not a URL"),
        ("http://a:1,http://a:notaport", "is not a URL"),
        ("http://a:1,,http://b:2", "ends in a comma"),
        ("http://a:1,", "ends in a comma"),
        ("http://a:1, ,", "ends in a comma"),
        (",", "ends in a comma"),
        ("http://u:secret-password#1@h:1", "percent-encode / [?] #"),
        ("http://u:secret-password/1@h:1,http://b:2", "is not a URL"),
        ("http://u:secret-password?1@h:1", "is not a URL"),
        ("http://u:secret-password@h:99999", "is not a URL"),
        ("http://localhost:99999/v1", "names port 99999; a port is 1 to 65535"),
        ("http://a:1,http://[::1]:70000", "names port 70000"),
        ("http://u:secret-password\t@h:1", "control character"),
        ("http://h:1/\x1b]52;c;aGk=\x07", "control character"),
        ("http://h:1/\x1b[31mred", "control character"),
        ("http://h:1/v1\x00", "control character"),
        (",".join(f"http://h{index}:1" for index in range(257)), "at most 256"),
        (",".join(f"http://h{index}:1" for index in range(5000)), "5,000 servers"),
        ("http://a:1,http://A:1/", "twice"),
        ("http://a,http://a:80", "twice"),
        ("https://u:secret-password@h:1,https://h:1", "twice"),
    ],
)
def test_a_bad_endpoint_list_is_refused_naming_the_fix(endpoint: str, words: str) -> None:
    with pytest.raises(LaneConfigError, match=words) as refused:
        server_lane(endpoint)
    assert "\n" not in str(refused.value) and "secret-password" not in str(refused.value)


@pytest.mark.parametrize(
    ("toml", "outcome"),
    [
        ('["http://a:1", "http://b:2"]', "http://a:1,http://b:2"),
        ('["http://a:1"]', "http://a:1"),
        ("[]", "empty list"),
        ('["http://a:1", 8]', "a URL in quotes"),
        ('["http://a:1", "http://a:1"]', "twice"),
    ],
)
def test_a_toml_endpoint_list(tmp_path: Path, toml: str, outcome: str) -> None:
    path = tmp_path / "pairs.toml"
    path.write_text(f'[pairs.fleet]\na = {{ backend = "server", endpoint = {toml} }}\n')
    if outcome.startswith("http"):
        assert load_pairs_file(path)["fleet"].a.endpoint == outcome
    else:
        with pytest.raises(LaneConfigError, match=outcome):
            load_pairs_file(path)


def test_a_masked_entry_is_refused_before_any_server_is_contacted() -> None:
    lane = server_lane("http://a:1", "http://***@b:2")
    with pytest.raises(LaneConfigError, match=r"saved without its credentials"):
        lane.check_credentials("a")


@pytest.mark.parametrize(
    ("endpoint", "words"),
    [
        ("http://a:1,http://a:1", "twice"),
        (",", "ends in a comma"),
        ("http://a:1,nonsense", "not a URL"),
        ("http://h:1/\x1b]52;c;aGk=\x07", "control character"),
        ("http://a:1,http://***@b:2", "saved without its credentials"),
    ],
)
def test_the_command_line_refuses_a_bad_endpoint_list_in_one_line(
    endpoint: str, words: str
) -> None:
    lane = ["--lane-a", f"endpoint={endpoint}"]
    done = specdiff_here("run", "--pair", "servers", "--prompt", "Hi", *lane)
    assert done.returncode == 2, done.stderr
    # a masked entry is found as the lane loads, after the line saying it loads
    errors = [line for line in done.stderr.splitlines() if not line.startswith("loading ")]
    assert len(errors) == 1 and words in errors[0] and "Traceback" not in done.stderr
    assert "\x1b" not in done.stderr and "\x07" not in done.stderr


# -- against real servers --------------------------------------------------------------


@pytest.mark.server
@pytest.mark.parametrize(("status", "seconds"), [("429", 1), ("429date", 2), ("503", 1)])
def test_a_busy_server_is_waited_for_as_its_retry_after_says(status: str, seconds: int) -> None:
    with fault_server(busy_mode(status, 2, seconds)) as url:
        client = ServerClient(server_lane(url, retries=3), "")
        try:
            client.pin()
            began = time.monotonic()
            lines = stream(client)
            took = time.monotonic() - began
        finally:
            client.close()
    assert "data: [DONE]" in lines
    assert client.backoff.retries == 2
    # an HTTP date has whole seconds: it may come up to one second short
    least = 2 * (seconds - (1 if status == "429date" else 0))
    assert took >= least and client.backoff.waited >= least
    assert client.backoff.waited <= 2 * seconds * (1 + JITTER) + 0.5


@pytest.mark.server
@pytest.mark.parametrize("status", ["429", "503"])
def test_a_spent_budget_ends_the_request_in_one_restartable_line(status: str) -> None:
    with fault_server(busy_mode(status, 100, 0)) as url:
        client = ServerClient(server_lane(url, retries=2), "")
        try:
            client.pin()
            with pytest.raises(EndpointFailed) as failed:
                stream(client)
        finally:
            client.close()
    message = str(failed.value)
    assert f"HTTP {status}" in message and "sent 3 times" in message and "\n" not in message
    assert failed.value.restartable and client.backoff.retries == 2


@pytest.mark.server
def test_a_dead_endpoint_is_set_aside_and_the_live_one_serves_everything() -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there: refused
    with fault_server(busy_mode("pooled", 0)) as live:
        lane = server_lane(dead, live, retries=BREAK_AFTER)
        client = ServerClient(lane, "")
        try:
            served = []
            for _ in range(8):
                endpoint = client.pin()
                try:
                    stream(client)
                    served.append(endpoint.shown)
                except EndpointFailed as failure:
                    assert failure.restartable and "cannot connect" in str(failure)
                finally:
                    client.unpin()
            stats = httpx.get(f"{live}/stats", timeout=5).json()
        finally:
            client.close()
    assert served and set(served) == {live}
    assert len(served) >= 7  # the dead one failed at most the first prompt sent there
    assert stats["posts"] == len(served)


@pytest.mark.server
def test_unpinned_requests_move_to_the_live_endpoint_and_a_lost_pool_says_why() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with fault_server(busy_mode("pooled", 0)) as live:
        client = ServerClient(server_lane(dead, live, retries=4), "")
        try:
            answers = [client.request("GET", "/v1/models").status for _ in range(6)]
        finally:
            client.close()
    assert answers == [200] * 6
    other_dead = f"http://127.0.0.1:{free_port()}"
    client = ServerClient(server_lane(dead, other_dead, retries=1), "")
    try:
        with pytest.raises(ServerError) as lost:
            for _ in range(BREAK_AFTER):
                client.request("GET", "/v1/models")
    finally:
        client.close()
    assert "\n" not in str(lost.value) and dead in str(lost.value)


@pytest.mark.server
@pytest.mark.parametrize("requests", [5, 20])
def test_one_connection_serves_many_requests(requests: int) -> None:
    with fault_server(busy_mode("pooled", 0)) as url:
        client = ServerClient(server_lane(url), "")
        try:
            # the first request opens the client's connection (the server's readiness
            # check opened another before)
            before = client.request("GET", "/stats").json()
            for _ in range(requests):
                client.pin()
                stream(client)
                client.unpin()
            after = client.request("GET", "/stats").json()
        finally:
            client.close()
    assert after == {"connections": before["connections"], "posts": requests}


@pytest.mark.server
def test_lanes_of_one_endpoint_list_share_one_pool_and_spread_their_load() -> None:
    with (
        fault_server(busy_mode("pooled", 0)) as first,
        fault_server(busy_mode("pooled", 0)) as second,
    ):
        lane = server_lane(first, second)
        clients = [ServerClient(lane, "") for _ in range(4)]
        try:
            assert len({id(c.pool) for c in clients}) == 1
            # room for every lane's request in flight, and their side requests
            assert clients[0].pool.connections == len(clients) + pools.SPARE_CONNECTIONS
            pinned = [c.pin().shown for c in clients]  # four generations in flight at once
            threads = [threading.Thread(target=stream, args=(c,)) for c in clients]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
            posts = [httpx.get(f"{u}/stats", timeout=5).json()["posts"] for u in (first, second)]
        finally:
            for c in clients:
                c.close()
    assert sorted(pinned) == sorted([first, second] * 2)
    assert posts == [2, 2]
    assert not pools._SHARED  # the last client closed the pool
