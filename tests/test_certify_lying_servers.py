"""certify against servers whose words cannot be taken as evidence (tests/servers.py):
a hit counter that restarts, /metrics that never end or repeat a series, a gauge that
never changes, impossible draft counts, a server that ignores its budget; and the
llama-server reached through its OpenAI API. Each is "not tested" with its reason, or a
named fault, never "holds"; and a property asked for but not tested fails the exit code."""

from __future__ import annotations

import json
from typing import Any

import pytest

from specdiff.cli import main
from tests.servers import (
    DRAFT_CLAIM,
    deployment_server,
    fault_server,
    llama_like_server,
)

pytestmark = [pytest.mark.model, pytest.mark.server]

SMALL = ["-n", "2", "--batch-size", "3", "--fillers", "3", "--max-tokens", "8", "--quiet"]
NOT_TESTED_EXIT = 3


def certify(capsys: Any, *arguments: str) -> tuple[int, dict[str, Any], str]:
    code = main(["certify", "--json", *SMALL, *arguments])
    captured = capsys.readouterr()
    assert code in (0, 1, NOT_TESTED_EXIT), captured.err
    return code, json.loads(captured.out), captured.err


def entry(data: dict[str, Any], name: str) -> dict[str, Any]:
    return next(e for e in data["properties"] if e["name"] == name)


def test_a_hit_counter_that_goes_backwards_is_a_restart_not_a_cold_request(capsys) -> None:
    with deployment_server("vllm-restart") as url:
        code, data, _ = certify(capsys, "--endpoint", url, "--property", "prefix-cache")
    cache = entry(data, "prefix-cache")
    assert cache["verdict"] == "not tested", cache["why"]
    assert cache["identical"] == cache["compared"] == 1  # the texts agreed: still no verdict
    assert "went backwards (1000 to 0)" in cache["why"] and "restarted" in cache["why"]
    assert code == NOT_TESTED_EXIT


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        ("vllm-endless-metrics", "ran past 4 MiB and was cut short"),
        ("vllm-doubled", "more than once"),
    ],
)
def test_a_cut_or_repeated_metrics_answer_is_no_count(mode: str, said: str, capsys) -> None:
    with deployment_server(mode) as url:
        code, data, _ = certify(capsys, "--endpoint", url, "--property", "batch-invariance")
    batch = entry(data, "batch-invariance")
    assert batch["verdict"] == "not tested", batch["why"]
    assert said in batch["why"] and "not evidence" in batch["why"]
    assert "server_running_most" not in batch["proof"]["facts"]
    assert code == NOT_TESTED_EXIT


def test_a_running_count_that_never_changes_shows_no_batch(capsys) -> None:
    with deployment_server("vllm-busy") as url:
        code, data, _ = certify(
            capsys, "--endpoint", url, "--property", "batch-invariance", "--property", "needle"
        )
    for name in ("batch-invariance", "needle"):
        found = entry(data, name)
        assert found["verdict"] == "not tested", (name, found["why"])
        assert "beyond the 4 running before" in found["why"]
        facts = found["proof"]["facts"]
        assert facts["server_running_before"] == facts["server_running_most"] == 4
    assert code == NOT_TESTED_EXIT


def test_more_drafts_accepted_than_tokens_generated_is_no_evidence(capsys) -> None:
    with llama_like_server("llama-drafts") as liar, llama_like_server("llama-plain") as plain:
        code, data, _ = certify(
            capsys, "--endpoint", liar, "--endpoint", plain, "--both", "api=llama-server",
            "--property", "speculation", "--max-tokens", "6",
        )  # fmt: skip
    speculation = entry(data, "speculation")
    assert speculation["verdict"] == "not tested", speculation["why"]
    assert speculation["identical"] == speculation["compared"] == 2
    assert f"claimed {DRAFT_CLAIM} of {DRAFT_CLAIM} drafted tokens" in speculation["why"]
    assert "6-token completion" in speculation["why"]
    assert code == NOT_TESTED_EXIT


@pytest.mark.parametrize(
    ("mode", "said"),
    [("unbounded", "still sending its answer"), ("endless", "sent over 4 MiB")],
)
def test_a_server_that_ignores_the_budget_has_no_bare_client_timing(
    mode: str, said: str, capsys
) -> None:
    with fault_server(mode) as url:
        code, data, _ = certify(
            capsys, "--endpoint", url, "--property", "run-to-run", "--max-tokens", "6",
            "--both", "timeout=2",
        )  # fmt: skip
    cost = data["cost"]
    assert "bare_client_seconds" not in cost and "through_specdiff_seconds" not in cost
    assert said in cost["bare_client_fault"] and "ignores max_tokens" in cost["bare_client_fault"]
    assert any(note.startswith("no bare-client timing: ") for note in data["notes"])
    assert entry(data, "run-to-run")["verdict"] == "holds" and code == 0


def test_llama_server_on_its_openai_api_loses_the_cache_property_only(capsys) -> None:
    with llama_like_server("llama-openai") as url:
        code, data, _ = certify(
            capsys, "--endpoint", url, "--property", "run-to-run", "--property", "prefix-cache"
        )
    assert data["subject"]["engine"] == "llama-server"
    assert entry(data, "run-to-run")["verdict"] == "holds"
    cache = entry(data, "prefix-cache")
    assert cache["verdict"] == "not tested" and "--both api=llama-server" in cache["why"]
    assert code == NOT_TESTED_EXIT


def test_a_named_property_that_cannot_be_tested_is_not_a_pass(capsys) -> None:
    with deployment_server("vllm-serial") as url:
        code, data, err = certify(capsys, "--endpoint", url, "--property", "batch-invariance")
        batch = entry(data, "batch-invariance")
        assert batch["verdict"] == "not tested"
        assert "never showed two requests running at once" in batch["why"]
        assert code == NOT_TESTED_EXIT
        assert "asked for but not tested: batch-invariance" in err
        # the default set reports what it could not test; --require makes that a failure
        default, _, _ = certify(capsys, "--endpoint", url)
        required, _, err = certify(capsys, "--endpoint", url, "--require", "batch-invariance")
    assert default == 0
    assert required == NOT_TESTED_EXIT and "batch-invariance" in err


def test_llama_server_without_log_probabilities_on_its_openai_api_names_its_own(capsys) -> None:
    with llama_like_server("llama-nologprobs") as url:
        code = main(["certify", "--quiet", "--endpoint", url, "--property", "run-to-run"])
    captured = capsys.readouterr()
    assert code == 2 and captured.err.count("\n") == 1
    assert "--both api=llama-server" in captured.err
    assert "logits_all" not in captured.err
