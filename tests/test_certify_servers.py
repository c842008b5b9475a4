"""certify against servers: vLLM- and SGLang-style deployment servers (tests/servers.py)
that batch and cache honestly, vary with the load, or lie about cache hits; a real
llama-server with --parallel 4 (and a speculative one beside a plain one); and the bad
input only a server shows (nothing listening, no log-probabilities)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specdiff.cli import main
from specdiff.engine.server.process import LlamaServer, find_llama_server
from tests.servers import deployment_server, fault_server, free_port

pytestmark = [pytest.mark.model, pytest.mark.server]

SMALL = ["-n", "2", "--batch-size", "3", "--fillers", "3", "--max-tokens", "8", "--quiet"]
NOT_TESTED_EXIT = 3
"""A property named with --property that could not be tested."""


def certify(capsys: Any, *arguments: str) -> tuple[int, dict[str, Any]]:
    code = main(["certify", "--json", *SMALL, *arguments])
    captured = capsys.readouterr()
    assert code in (0, 1, NOT_TESTED_EXIT), captured.err
    return code, json.loads(captured.out)


def verdicts(data: dict[str, Any]) -> dict[str, str]:
    return {entry["name"]: entry["verdict"] for entry in data["properties"]}


def entry(data: dict[str, Any], name: str) -> dict[str, Any]:
    return next(e for e in data["properties"] if e["name"] == name)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_an_honest_batching_server_holds_with_its_evidence(engine: str, capsys) -> None:
    with deployment_server(engine) as url:
        code, data = certify(capsys, "--endpoint", url)
    assert data["subject"]["engine"] == engine
    assert verdicts(data) == {
        "run-to-run": "holds",
        "batch-invariance": "holds",
        "needle": "holds",
        "prefix-cache": "holds",
        "decode-vs-prefill": "not tested",
        "speculation": "not tested",
    }
    assert code == 0
    batch = entry(data, "batch-invariance")
    assert batch["proof"]["facts"]["server_running_most"] >= 2
    assert batch["identical"] == batch["compared"] == 3
    assert batch["largest_difference"] == 0.0
    cache = entry(data, "prefix-cache")["proof"]["facts"]
    assert cache["cold_hits"] == 0 and cache["warm_hits"] > 0


def test_a_load_dependent_server_is_broken_and_the_control_says_so(capsys) -> None:
    with deployment_server("vllm") as steady, deployment_server("vllm-variant") as variant:
        code, data = certify(
            capsys,
            "--endpoint", steady, "--endpoint", variant,
            "--mode-flag", "VLLM_BATCH_INVARIANT=1",
            "--property", "batch-invariance", "--property", "needle",
        )  # fmt: skip
        alone, direct = certify(capsys, "--endpoint", variant, "--property", "batch-invariance")
    assert code == 0 and verdicts(data) == {"batch-invariance": "holds", "needle": "holds"}
    control = data["control"]
    assert control is not None and set(control["broken"]) == {"batch-invariance", "needle"}
    assert alone == 1
    batch = entry(direct, "batch-invariance")
    # its words change from token 5 on while another request runs beside it
    assert batch["verdict"] == "broken" and batch["fork"]["index"] >= 5
    assert batch["identical"] < batch["compared"]


@pytest.mark.parametrize("engine", ["vllm-liar", "sglang-liar"])
def test_a_server_that_claims_cache_hits_it_did_not_make_is_not_believed(
    engine: str, capsys
) -> None:
    with deployment_server(engine) as url:
        code, data = certify(capsys, "--endpoint", url, "--property", "prefix-cache")
    cache = entry(data, "prefix-cache")
    assert cache["verdict"] == "not tested"
    assert cache["identical"] == cache["compared"] == 1  # the texts agreed: still no verdict
    assert "cold request" in cache["why"]
    assert code == NOT_TESTED_EXIT  # the one property asked for was not tested


def test_a_server_that_shows_nothing_of_itself_is_not_tested(capsys, tmp_path: Path) -> None:
    page = tmp_path / "certificate.html"
    with deployment_server("bare") as url:
        code, data = certify(capsys, "--endpoint", url, "--html", str(page))
    html = page.read_text(encoding="utf-8")
    assert html.count('class="property"') == 6 and 'data-verdict="holds"' in html
    found = verdicts(data)
    assert found["run-to-run"] == "holds"
    for name in ("batch-invariance", "needle", "prefix-cache"):
        assert found[name] == "not tested", name
    assert "no running-request count" in entry(data, "batch-invariance")["why"]
    assert code == 0
    assert data["outcome"].startswith("every tested property holds (run-to-run); not tested:")


def test_nothing_listening_is_one_line_and_exit_2(capsys) -> None:
    assert main(["certify", "--quiet", "--endpoint", f"http://127.0.0.1:{free_port()}"]) == 2
    captured = capsys.readouterr()
    assert "cannot connect" in captured.err and captured.err.count("\n") == 1


def test_a_server_without_logprobs_is_one_line_and_exit_2(capsys) -> None:
    with fault_server("nologprobs") as url:
        assert main(["certify", "--quiet", "--endpoint", url, "--property", "run-to-run"]) == 2
    captured = capsys.readouterr()
    assert "without log-probabilities" in captured.err and captured.err.count("\n") == 1


@pytest.fixture(scope="module")
def llama_servers(model_path: Path):
    binary = find_llama_server()
    common = ["--threads", "1", "--parallel", "4"]
    speculative = LlamaServer(binary, model_path, [*common, "--spec-type", "ngram-simple"])
    plain = LlamaServer(binary, model_path, common)
    with speculative, plain:
        yield speculative.url, plain.url


def test_llama_server_every_property_runs_with_evidence(llama_servers, capsys) -> None:
    speculative, plain = llama_servers
    code, data = certify(
        capsys, "--endpoint", speculative, "--endpoint", plain, "--both", "api=llama-server",
        "--max-tokens", "24",
    )  # fmt: skip
    print(json.dumps({e["name"]: [e["verdict"], e["why"]] for e in data["properties"]}, indent=1))
    assert data["subject"]["engine"] == "llama-server"
    for found in data["properties"]:
        assert found["verdict"] in ("holds", "broken"), (found["name"], found["why"])
        assert found["compared"] > 0
    assert entry(data, "batch-invariance")["proof"]["facts"]["source"] == "/slots"
    assert entry(data, "prefix-cache")["proof"]["facts"]["warm_hits"] > 0
    broken = any(found["verdict"] == "broken" for found in data["properties"])
    assert code == (1 if broken else 0)


def test_serve_pair_certifies_its_speculative_server_against_its_plain_one(capsys) -> None:
    code = main(
        [
            "serve-pair", "--threads", "1", "--server-arg=--parallel", "--server-arg=4",
            "certify", "--json", "--quiet", "--max-tokens", "24",
            "--property", "run-to-run", "--property", "speculation",
        ]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert code in (0, 1), captured.err
    data = json.loads(captured.out)
    assert data["subject"]["engine"] == "llama-server"
    assert data["subject"]["other_endpoint"] != data["subject"]["endpoint"]
    speculation = entry(data, "speculation")
    assert speculation["verdict"] in ("holds", "broken"), speculation["why"]
    assert speculation["proof"]["facts"]["accepted"] > 0  # the speculative one drafted
    assert code == (1 if "broken" in verdicts(data).values() else 0)
