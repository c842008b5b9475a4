"""serve-pair with every speculation type a llama-server build lists: the types and the
draft options read from the binary's own help, a server's refusal as its own reason in
one line, bad input refused before any server starts, and real pairs with ngram-mod and
with a draft model, whose accepted drafts come back rescored."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from specdiff.engine.server.process import (
    _help_entries,
    find_llama_server,
    refusal_reason,
    server_help,
    spec_types,
    usable_option,
)
from specdiff.engine.server.rescore import RESCORED_BY
from specdiff.prompts import load as load_prompts

REPETITIVE = load_prompts("repetitive")[0]["prompt"]
NEW_HELP = """\
--spec-draft-model, -md, --model-draft FNAME
                                        draft model for speculative decoding (default: unused)
--spec-type none,draft-simple,draft-mtp,ngram-simple,ngram-mod
                                        comma-separated list of types
--spec-draft-n-max N                    number of tokens to draft (default: 3)
--draft, --draft-n, --draft-max N       the argument has been removed. use --spec-draft-n-max
"""
OLD_HELP = """\
-md,   --model-draft FNAME              draft model for speculative decoding (default: unused)
--spec-type [none|ngram-simple]         type of speculative decoding to use
--draft-max, --draft, --draft-n N       number of tokens to draft (default: 16)
"""


def specdiff(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specdiff", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.parametrize(
    ("help_text", "types", "draft_model", "draft_max"),
    [
        (
            NEW_HELP,
            ("none", "draft-simple", "draft-mtp", "ngram-simple", "ngram-mod"),
            "--spec-draft-model",
            "--spec-draft-n-max",
        ),
        (OLD_HELP, ("none", "ngram-simple"), "--model-draft", "--draft-max"),
        ("usage: llama-server [options]\n", (), None, None),
    ],
    ids=["renamed-options", "older-build", "no-speculation"],
)
def test_the_types_and_draft_options_come_from_the_builds_help(
    help_text: str,
    types: tuple[str, ...],
    draft_model: str | None,
    draft_max: str | None,
    tmp_path: Path,
) -> None:
    binary = tmp_path / "llama-server"
    binary.write_text(f"#!/bin/sh\ncat <<'END'\n{help_text}END\n", encoding="utf-8")
    binary.chmod(0o755)
    assert spec_types(binary) == types
    assert usable_option(binary, "--spec-draft-model", "--model-draft") == draft_model
    # an option the help keeps only to say it was removed is not offered
    assert usable_option(binary, "--spec-draft-n-max", "--draft-max") == draft_max


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (
            [
                "0.01.2 I srv load_model: loading model 'x.gguf'",
                "0.08.1 W llama_init_from_model: context type MTP requested but model "
                "doesn't contain MTP layers",
                "0.08.1 E common_speculative_init_result: failed to create MTP context",
                "0.08.2 E srv llama_server: exiting due to model loading error",
            ],
            "llama_init_from_model: context type MTP requested but model doesn't contain "
            "MTP layers; common_speculative_init_result: failed to create MTP context",
        ),
        (
            ["build: 0 (unknown)", "error: invalid argument: --bogus", ""],
            "error: invalid argument: --bogus",
        ),
        (["0.1 I loading", "0.2 E bad \x1b]52;c;aGk=\x07 model"], "bad \\x1b]52;c;aGk=\\x07 model"),
        ([], "no output"),
        (["only a line"], "only a line"),
    ],
    ids=["warning-then-error", "plain-error", "escapes", "silent", "no-levels"],
)
def test_a_refusal_is_the_servers_own_reason_on_one_line(lines: list[str], expected: str) -> None:
    reason = refusal_reason(lines)
    assert reason == expected
    assert reason.isprintable()


@pytest.mark.server
def test_every_listed_type_is_in_the_real_binarys_help() -> None:
    binary = find_llama_server()
    types = spec_types(binary)
    assert {"ngram-simple", "ngram-mod"} <= set(types)
    entry = _help_entries(server_help(binary))["--spec-type"]
    assert all(kind in entry for kind in types)
    assert usable_option(binary, "--spec-draft-model", "--model-draft") is not None
    assert usable_option(binary, "--spec-draft-n-max", "--draft-max") is not None


RESTARTED = re.compile(
    r"specdiff: llama-server on port \d+ was killed by SIG[A-Z]+ at start; starting it again "
    r"with --no-repack \(llama\.cpp's repacked CPU kernels crash on some CPUs\)$"
)


@pytest.mark.server
@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--spec-type", "bogus"], "--spec-type 'bogus'"),
        (["--spec-type", "ngram-mod,\x1b[2Jx"], "\\x1b"),
        (["--draft-max", "0"], "--draft-max"),
        (["--draft-max", "257"], "--draft-max"),
        (["--draft-max", "many"], "--draft-max"),
        (["--draft-model", "/no/such/draft.gguf"], "--draft-model"),
        (["--spec-type", "draft-simple", "--draft-model", "NOT_GGUF"], "is not a GGUF model"),
        (["--spec-type", "ngram-mod", "--draft-model", "NOT_GGUF"], "drafts without a model"),
        (["--spec-type", "draft-mtp"], "MTP"),  # the bundled model has no MTP head
        # served on without speculation (it only logs why): a plain-vs-plain pair
        (["--spec-type", "draft-simple"], "give the draft GGUF with --draft-model"),
        (["--spec-type", "draft-simple", "--server-arg-a=--no-slots"], "logged that specul"),
        (["--server-arg=--port", "--server-arg=8080"], "--server-arg --port: serve-pair"),
        (["--server-arg=--port=8080"], "--server-arg --port: serve-pair"),
        (["--server-arg=--host=0.0.0.0"], "loopback (127.0.0.1) only"),
        (["--server-arg-a=-m", "--server-arg-a=x.gguf"], "serve-pair --model PATH"),
        (["--server-arg-b=--spec-type", "--server-arg-b=ngram-mod"], "server b is plain"),
        (["--server-arg-a=--model-draft", "--server-arg-a=d.gguf"], "--draft-model PATH"),
        (["--server-arg-a=--version"], "prints and exits"),
        (["--spec-type", "none"], "make server a plain as well"),
        (["--spec-type", "ngram-simple,"], "has an empty entry"),
        (["--spec-type", "ngram-simple,ngram-mod,ngram-simple"], "ngram-simple twice"),
        (["--spec-type", "draft-simple", "--draft-model", ""], "--draft-model is empty"),
        (["--model", ""], "--model: is empty"),
    ],
    ids=["unknown-type", "escapes", "draft-max-0", "draft-max-big", "draft-max-text",
         "missing-draft", "draft-not-gguf", "draft-model-unread", "no-mtp-head",
         "draft-without-model", "no-slots", "port", "port-joined", "host", "model", "spec-type-b",
         "draft-model-arg", "version", "none", "empty-entry", "twice", "empty-draft",
         "empty-model"],
)  # fmt: skip
def test_bad_serve_pair_input_is_one_line_and_exit_2(
    tmp_path: Path, args: list[str], names: str
) -> None:
    """With the inner command's --quiet, nothing but the error reaches stderr, even where
    a server was started before it refused."""
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("not a model\n", encoding="utf-8")
    args = [str(not_gguf) if arg == "NOT_GGUF" else arg for arg in args]
    done = specdiff("serve-pair", *args, "--threads", "1", "run", "--max-tokens", "4", "--quiet")
    # on a CPU whose repacked kernels crash llama-server at start (AMX Xeons), the one
    # note that it was started again with --no-repack comes first: a fact, not progress
    lines = [line for line in done.stderr.strip().splitlines() if not RESTARTED.match(line)]
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert len(lines) == 1 and names in lines[0] and lines[0].isprintable(), lines
    assert lines[0].startswith("specdiff:")


@pytest.mark.parametrize(
    ("inner", "fragment"),
    [
        (["run", "--both", "endpoint=http://127.0.0.1:9"], "points the lanes at the servers"),
        (["run", "--lane-a", "endpoint=http://127.0.0.1:9"], "points the lanes at the servers"),
        (["run", "--lane-b=endpoint=http://127.0.0.1:9"], "points the lanes at the servers"),
        (["run", "--bot", "endpoint=http://127.0.0.1:9"], "points the lanes at the servers"),
        (["run", "--pair", "ubatch"], "drop --pair"),
        (["live", "--pair", "spec-vs-plain"], "drop --pair"),
        (["suite", "coding", "--report", "r", "--pair", "ubatch"], "drop --pair"),
        (["run", "--pairs", "p.toml"], "drop --pairs"),
        (["suite", "--resume", "--report", "r"], "cannot be resumed"),
        (["run", "--max-tokens", "0x"], "--max-tokens"),
    ],
)
def test_serve_pair_refuses_an_inner_command_it_cannot_serve(
    inner: list[str], fragment: str, capsys
) -> None:
    """Refused before any server starts (the binary named does not exist)."""
    from specdiff.cli import main

    code = main(["serve-pair", "--llama-server", "/no/such/binary", *inner])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and fragment in err[0], err


def test_both_keys_take_the_place_of_serve_pairs_own() -> None:
    """Read by the inner command's own parser: an abbreviation counts, a lane's own not."""
    from specdiff.cli.serve_pair import keys_given_to_both

    command = ["run", "--bot", "api=chat", "--both=label=x", "--lane-a", "rescore=off"]
    assert keys_given_to_both(command) == {"api", "label"}
    assert keys_given_to_both(["suite", "coding", "--report", "r", "--both", "api=chat"]) == {"api"}


@pytest.mark.model
@pytest.mark.server
def test_both_api_chat_reaches_both_serve_pair_lanes(tmp_path: Path) -> None:
    """serve-pair sets api=llama-server on each lane; --both api=chat replaces it on both,
    and the conversation is sent with the server's template."""
    messages = json.dumps([{"role": "user", "content": "Name a colour."}])
    done = specdiff(
        "serve-pair", "--threads", "1", "run", "--messages", messages, "--both", "api=chat",
        "--max-tokens", "4", "--json", "--save", "--sessions-dir", str(tmp_path),
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    [session] = tmp_path.glob("*.jsonl")
    header = json.loads(session.read_text(encoding="utf-8").splitlines()[0])
    assert header["lanes"]["a"]["api"] == header["lanes"]["b"]["api"] == "chat"
    assert set(header["lane_prompts"]) == {"a", "b"}
    assert "--spec-type" in header["lanes"]["a"]["server_flags"]


def _serve_pair(tmp_path: Path, *server_args: str) -> tuple[dict, list[dict]]:
    """serve-pair run --json --save on the repetitive prompt: the summary and the
    saved session's records."""
    done = specdiff(
        "serve-pair", "--threads", "1", *server_args, "run", "--prompt", REPETITIVE,
        "--max-tokens", "40", "--json", "--save", "--sessions-dir", str(tmp_path),
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    [session] = tmp_path.glob("*.jsonl")
    records = [json.loads(line) for line in session.read_text(encoding="utf-8").splitlines()]
    return json.loads(done.stdout), records


@pytest.mark.model
@pytest.mark.server
@pytest.mark.parametrize("kind", ["ngram-mod", "draft"])
def test_serve_pair_runs_each_speculation_type_with_drafts_rescored(
    kind: str, tmp_path: Path, q8_model_path: Path
) -> None:
    if kind == "draft":
        args = ["--spec-type", "draft-simple", "--draft-model", str(q8_model_path)]
        args += ["--draft-max", "4"]
    else:  # ngram-mod matches 24 tokens by default: the prompt is shorter than that
        args = ["--spec-type", "ngram-mod", "--server-arg-a=--spec-ngram-mod-n-match"]
        args += ["--server-arg-a=4"]
    summary, records = _serve_pair(tmp_path, *args, "--server-arg-b=--no-warmup")
    header, steps = records[0], [r for r in records if r.get("type") == "step"]
    lanes, executed = header["lanes"], header["executed"]
    assert f"--spec-type {args[1]}" in lanes["a"]["server_flags"]
    assert "--spec-ngram-mod-n-match 4" in lanes["a"]["server_flags"] or kind == "draft"
    assert "--no-warmup" in lanes["b"]["server_flags"]
    assert "--spec-type" not in lanes["b"]["server_flags"]
    # /props and /slots as the header keeps them: slots, and which of them speculate
    assert [slot["speculative"] for slot in executed["a"]["server"]["slots"]] == [True]
    assert [slot["speculative"] for slot in executed["b"]["server"]["slots"]] == [False]
    drafted = [step for step in steps if step["drafted"]]
    assert summary["lanes"]["a"]["drafted"] > 0 and drafted
    assert all(step["source"] == RESCORED_BY and len(step["top"]) >= 2 for step in drafted)
    assert summary["lanes"]["a"]["rescored_steps"] == [s["index"] for s in drafted]


ESCAPES = "\x1b]52;c;aGk=\x07\u202e"
SECRET = "sk-live-0123456789"


@pytest.mark.parametrize(
    ("params", "kept"),
    [
        ({"speculative.types": "none,ngram-mod", "speculative.n_max": 16}, None),
        ({"speculative.types": ESCAPES + "x" * 500}, None),
        ({"speculative.nested": {"a": [1]}, "speculative.nan": float("nan")}, {}),
        ({"speculative.key": f"key {SECRET}"}, None),
        ({"cache_prompt": True, "n_batch": 2048, "n_ubatch": 512}, None),
        ({"cache_prompt": "yes", "n_batch": -1, "n_ubatch": 1.5}, {}),
    ],
    ids=["settings", "escapes-long", "nested-nan", "secret", "batch-cache", "wrong-types"],
)
def test_the_header_keeps_props_settings_bounded_masked_and_typed(
    params: dict, kept: dict | None
) -> None:
    from specdiff.engine.server.client import ServerClient
    from specdiff.lanes import Lane

    lane = Lane(backend="server", endpoint="http://127.0.0.1:9", api_key_env="")
    client = ServerClient(lane, SECRET)
    try:
        props = client._props({"default_generation_settings": {"params": params, "n_ctx": 64}})
    finally:
        client.close()
    settings = {k: v for k, v in props.items() if k != "n_ctx"}
    if kept is not None:
        assert settings == kept
    shown = json.dumps(props, ensure_ascii=False)
    assert SECRET not in shown and "\x1b" not in shown and len(shown) < 600
    for value in [*settings.get("speculative", {}).values(), *settings.values()]:
        assert isinstance(value, (str, int, float, bool, dict))


@pytest.mark.parametrize(
    ("arguments", "kept"),
    [
        (["--api-key", "sk-a1"], ["--api-key", "***"]),
        (["--api-key=sk-a1", "--threads", "2"], ["--api-key=***", "--threads", "2"]),
        (["--hf-token", "hf_x", "--no-warmup"], ["--hf-token", "***", "--no-warmup"]),
        (["--MY-SECRET", "s", "--db-password=p"], ["--MY-SECRET", "***", "--db-password=***"]),
        (["--api-key-file", "/k.txt"], ["--api-key-file", "/k.txt"]),
        (["--ssl-key-file", "/k.pem", "--ssl-cert-file", "/c.pem"], None),
        (["--api-key", "--threads", "2"], None),  # a flag, not a value, follows
        (["--spec-type", "ngram-mod", "--ctx-size", "64"], None),
    ],
    ids=["separate", "joined", "hf-token", "secret-password", "key-file", "ssl-paths",
         "flag-follows", "nothing-secret"],
)  # fmt: skip
def test_server_flags_keep_no_secret_value(arguments: list[str], kept: list[str] | None) -> None:
    from specdiff.cli.serve_pair import masked_arguments

    assert masked_arguments(arguments) == (arguments if kept is None else kept)


SERVER_SECRETS = ("sk-serve-pair-0123456789", "hf_serve_pair_9876543210")


@pytest.mark.model
@pytest.mark.server
def test_no_server_secret_reaches_the_session_or_its_report(tmp_path: Path) -> None:
    import os

    key, token = SERVER_SECRETS
    done = subprocess.run(
        [
            sys.executable, "-m", "specdiff", "serve-pair", "--threads", "1",
            "--server-arg-a=--api-key", f"--server-arg-a={key}",
            "--server-arg-b=--hf-token", f"--server-arg-b={token}",
            "run", "--lane-a", "api_key_env=SPECDIFF_SERVE_KEY", "--prompt", "Hello",
            "--max-tokens", "4", "--save", "--sessions-dir", str(tmp_path),
        ],
        capture_output=True, text=True, timeout=240, check=False,
        env=dict(os.environ, SPECDIFF_SERVE_KEY=key),
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    [session] = tmp_path.glob("*.jsonl")
    report = specdiff("export", str(session), "--format", "md")
    assert report.returncode == 0, report.stderr
    header = json.loads(session.read_text(encoding="utf-8").splitlines()[0])
    assert header["lanes"]["a"]["server_flags"].count("--api-key ***") == 1
    assert header["lanes"]["b"]["server_flags"].count("--hf-token ***") == 1
    for shown in (session.read_text(encoding="utf-8"), report.stdout, done.stdout, done.stderr):
        assert not any(secret in shown for secret in SERVER_SECRETS)


def _llama_server_processes(port: int) -> list[str]:
    """The running processes whose command line names `port` after --port."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().decode("utf-8", "replace").split("\0")
        except OSError:  # the process ended meanwhile
            continue
        if "--port" in words and str(port) in words:
            found.append(" ".join(words))
    return found


@pytest.mark.model
@pytest.mark.server
@pytest.mark.parametrize("where", ["a-folder", "missing-folder", "under-a-file"])
def test_an_unwritable_log_is_one_line_and_leaves_no_server(
    where: str, tmp_path: Path, model_path: Path
) -> None:
    from specdiff.engine.server.process import LlamaServer, ServerProcessError

    (tmp_path / "file").write_text("", encoding="utf-8")
    log = {
        "a-folder": tmp_path,
        "missing-folder": tmp_path / "no" / "such" / "server.log",
        "under-a-file": tmp_path / "file" / "server.log",
    }[where]
    server = LlamaServer(find_llama_server(), model_path, ["--threads", "1"], log=log)
    try:
        with pytest.raises(ServerProcessError) as caught:
            server.start(wait_seconds=60)
    finally:
        server.stop()
    message = str(caught.value)
    assert str(log) in message and "writable" in message and "\n" not in message
    assert server.process is None and not _llama_server_processes(server.port)


CRASH_THEN_REFUSE = """\
#!/bin/sh
case "$*" in
  *--no-repack*) echo "second start"; echo "error: no such model"; exit 1 ;;
esac
echo "first start"
# a child that keeps the output open and writes after the server has died
( sleep 0.5; echo "late from the first start" ) &
kill -SEGV $$
"""


def test_a_restart_with_no_repack_keeps_apart_the_first_starts_output(tmp_path: Path) -> None:
    """A server killed by a signal at start is started again with --no-repack; the first
    start's output, even what comes late, stays out of the second's reason, the log
    holds each line once, and the refusal says it happened also with --no-repack."""
    from specdiff.engine.server.process import LlamaServer, ServerProcessError

    binary = tmp_path / "llama-server"
    binary.write_text(CRASH_THEN_REFUSE, encoding="utf-8")
    binary.chmod(0o755)
    log = tmp_path / "server.log"
    said: list[str] = []
    server = LlamaServer(binary, tmp_path / "model.gguf", log=log, say=said.append)
    with pytest.raises(ServerProcessError) as caught:
        server.start(wait_seconds=30)
    message = str(caught.value)
    assert "also with --no-repack" in message and "no such model" in message, message
    assert len(said) == 1 and "--no-repack" in said[0]
    assert not any("first start" in line for line in server.output), list(server.output)
    lines = log.read_text(encoding="utf-8").splitlines()
    assert lines == ["first start", "late from the first start", "second start",
                     "error: no such model"]  # fmt: skip


@pytest.mark.parametrize(
    "argument",
    ["--port", "--port=1", "--host=0.0.0.0", "-m", "-hf", "--hf-repo=x/y", "-mu", "-md",
     "--spec-type=ngram-mod", "--spec-default", "--spec-draft-n-max=4"],
)  # fmt: skip
@pytest.mark.parametrize("option", ["--server-arg", "--server-arg-a", "--server-arg-b"])
def test_serve_pair_refuses_server_options_it_sets_itself(
    option: str, argument: str, capsys
) -> None:
    """Refused before any server starts, whichever server it was for and however joined."""
    from specdiff.cli import main

    code = main(["serve-pair", "--llama-server", "/no/such/binary", f"{option}={argument}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"specdiff: error: {option} {argument.partition('=')[0]}: ")
    assert err[0].endswith("; drop it")


@pytest.mark.server
@pytest.mark.parametrize(
    ("variable", "option"),
    [("LLAMA_ARG_SPEC_TYPE", "--spec-type"), ("LLAMA_ARG_HF_REPO", "--hf-repo"),
     ("LLAMA_ARG_SPEC_DRAFT_MODEL", "--spec-draft-model")],
)  # fmt: skip
def test_an_environment_variable_for_an_option_serve_pair_sets_is_refused(
    monkeypatch: pytest.MonkeyPatch, variable: str, option: str
) -> None:
    """llama-server reads LLAMA_ARG_* as its options, on both servers: server b would
    speculate under the label "plain"."""
    from specdiff.cli.common import ArgumentError
    from specdiff.cli.serve_pair import server_environment

    monkeypatch.setenv(variable, "1")
    with pytest.raises(ArgumentError) as raised:
        server_environment(find_llama_server())
    assert str(raised.value).startswith(f"{variable} is set, and it gives both servers {option}")


@pytest.mark.server
def test_other_llama_arg_variables_go_into_server_flags_secrets_masked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from specdiff.cli.serve_pair import server_environment

    monkeypatch.setenv("LLAMA_ARG_N_PARALLEL", "1")
    monkeypatch.setenv("LLAMA_ARG_API_KEY", "sk-live-0123456789")
    # serve-pair gives these on both command lines, which llama.cpp reads after them
    monkeypatch.setenv("LLAMA_ARG_HOST", "0.0.0.0")
    monkeypatch.setenv("LLAMA_ARG_PORT", "8080")
    words = server_environment(find_llama_server())
    assert "LLAMA_ARG_N_PARALLEL=1" in words and "LLAMA_ARG_API_KEY=***" in words
    assert "LLAMA_ARG_HOST=0.0.0.0" in words and "LLAMA_ARG_PORT=8080" in words
