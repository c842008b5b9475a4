from __future__ import annotations

from pathlib import Path

import pytest

from specdiff.errors import LaneConfigError
from specdiff.lanes import (
    Lane,
    apply_overrides,
    differences,
    lane_from_dict,
    load_pairs_file,
    parse_overrides,
    presets,
    unread_keys,
)


def test_each_preset_differs_in_the_one_thing_it_names() -> None:
    expected = {
        "spec-vs-plain": ["speculation"],
        "draft-vs-plain": ["speculation"],
        "lenient-vs-plain": ["speculation", "spec_accept"],
        "cache-vs-fresh": ["prefix"],
        "ubatch": ["n_batch", "n_ubatch"],
        "quant": ["quant"],
        "threads": ["threads", "threads_batch"],
        "gpu-vs-cpu": ["gpu_layers"],
        "servers": ["endpoint"],
        "server-cache-vs-fresh": ["prefix"],
    }
    pairs = presets()
    assert set(pairs) == set(expected)
    for name, keys in expected.items():
        assert differences(pairs[name].a, pairs[name].b) == keys, name


def test_ubatch_preset_is_512_vs_2() -> None:
    pair = presets()["ubatch"]
    assert (pair.a.n_batch, pair.a.n_ubatch, pair.b.n_batch, pair.b.n_ubatch) == (512, 512, 2, 2)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"n_ubatch": 0}, "'n_ubatch' must be between 1"),
        ({"n_ctx": 4}, "'n_ctx' must be between 16"),
        ({"speculation": "magic"}, "allowed: 'none', 'ngram', 'draft'"),
        ({"flash_attn": "maybe"}, "allowed: 'off', 'on', 'auto'"),
        ({"n_batch": 4, "n_ubatch": 8}, "must not exceed n_batch"),
        ({"threads": True}, "must be a whole number"),
        ({"repack": "yes"}, "allowed: 'auto', 'on', 'off'"),
        ({"type_v": "q8_0"}, "needs flash_attn=on"),
        ({"spec_ngram": 2, "spec_ngram_min": 3}, "must not exceed spec_ngram"),
        ({"prefix_text": "a", "prefix_tokens": 3}, "not both"),
    ],
)
def test_bad_values_name_the_key_and_the_rule(overrides: dict, message: str) -> None:
    with pytest.raises(LaneConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Lane(**overrides)


def test_cli_overrides_are_typed() -> None:
    parsed = parse_overrides(["n_ubatch=2", "repack=off", "speculation=ngram", "spec_adaptive=1"])
    assert parsed == {"n_ubatch": 2, "repack": "off", "speculation": "ngram", "spec_adaptive": True}
    lane = apply_overrides(Lane(), parsed | {"n_batch": 2})
    assert (lane.n_ubatch, lane.repack, lane.speculation) == (2, "off", "ngram")


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("n_ubatch", "is not key=value"),
        ("nubatch=2", "unknown lane key 'nubatch'; did you mean n_ubatch"),
        ("n_ubatch=two", "'n_ubatch' must be a whole number"),
        ("repack=sometimes", "'repack' must be auto, on or off"),
    ],
)
def test_bad_overrides(item: str, message: str) -> None:
    with pytest.raises(LaneConfigError, match=message):
        parse_overrides([item])


def test_lane_round_trips_through_a_dict() -> None:
    lane = Lane(speculation="draft", draft_model="/x.gguf", n_ctx=1024)
    assert lane_from_dict(lane.as_dict()) == lane
    with pytest.raises(LaneConfigError, match="unknown lane key 'color'"):
        lane_from_dict({**lane.as_dict(), "color": "red"})


def test_pairs_file(tmp_path: Path) -> None:
    path = tmp_path / "pairs.toml"
    path.write_text(
        "[defaults]\nn_ctx = 1024\n\n"
        '[pairs.tiny-ubatch]\ndescription = "512 vs 1"\nfrom = "ubatch"\n'
        "b = { n_batch = 1, n_ubatch = 1 }\n\n"
        '[pairs.fa]\na = { flash_attn = "on" }\n',
        encoding="utf-8",
    )
    pairs = load_pairs_file(path)
    tiny = pairs["tiny-ubatch"]
    assert (tiny.a.n_ubatch, tiny.b.n_ubatch, tiny.b.n_ctx, tiny.description) == (
        512,
        1,
        1024,
        "512 vs 1",
    )
    assert differences(pairs["fa"].a, pairs["fa"].b) == ["flash_attn"]
    assert pairs["spec-vs-plain"].a.n_ctx == 1024  # defaults reach the presets too


@pytest.mark.parametrize(
    ("line", "key", "reaches"),
    [
        ("gpu_layers = -1", "gpu_layers", "local"),
        ("main_gpu = 1", "main_gpu", "local"),
        ('split_mode = "row"', "split_mode", "local"),
        ("chat = true", "chat", "local"),
        ('speculation = "ngram"', "speculation", "local"),
        ("timeout = 120", "timeout", "server"),
        ('rescore = "off"', "rescore", "server"),
        ('server_flags = "--enable-deterministic-inference"', "server_flags", "server"),
        ('request = "{\\"seed\\": 1}"', "request", "server"),
    ],
)
def test_a_default_reaches_the_lanes_it_applies_to(
    tmp_path: Path, line: str, key: str, reaches: str
) -> None:
    """[defaults] is for every pair, presets included: an in-process key reaches the
    in-process lanes and a server key the server lanes, and neither breaks the others."""
    from specdiff.cli import build_parser
    from specdiff.cli.common import known_pairs, resolve_pair

    path = tmp_path / "pairs.toml"
    path.write_text(f'[defaults]\n{line}\n\n[pairs.mine]\nfrom = "ubatch"\n', encoding="utf-8")
    args = build_parser().parse_args(["run", "--pairs", str(path), "--pair", "mine"])
    known = known_pairs(args)
    assert not known.refused
    default = getattr(Lane(), key)
    for name in ("mine", "ubatch", "spec-vs-plain", "servers", "server-cache-vs-fresh"):
        pair = resolve_pair(args, known, name)
        for lane in (pair.a, pair.b):
            kind = "server" if lane.backend == "server" else "local"
            assert (getattr(lane, key) != default) == (kind == reaches), (name, lane)


def test_a_default_a_preset_cannot_take_refuses_only_that_preset(tmp_path: Path) -> None:
    """A default a preset refuses (prefix=cached on a completions server lane) is an
    error only where that preset is chosen, with its reason in one line."""
    from specdiff.cli import build_parser
    from specdiff.cli.common import known_pairs, resolve_pair

    path = tmp_path / "pairs.toml"
    path.write_text('[defaults]\nprefix = "cached"\n', encoding="utf-8")
    args = build_parser().parse_args(["run", "--pairs", str(path)])
    known = known_pairs(args)
    assert set(known.refused) == {"servers"}
    assert resolve_pair(args, known, "ubatch").a.prefix == "cached"
    assert "servers" not in known
    with pytest.raises(LaneConfigError) as raised:
        resolve_pair(args, known, "servers")
    message = str(raised.value)
    assert "\n" not in message and "[defaults] on pair 'servers'" in message
    assert "api=llama-server" in message and str(path) in message


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("endpoint", "http://h:1"),
        ("api", "chat"),
        ("api_model", "m"),
        ("api_key_env", "KEY"),
        ("request", "{}"),
        ("timeout", 5),
        ("retries", 0),
        ("rescore", "off"),
        ("server_flags", "--x"),
    ],
)
def test_a_server_key_on_an_in_process_lane_is_named_unread_not_a_difference(
    key: str, value: object
) -> None:
    """Nothing reads it there: run notes it, and it is no difference between two
    in-process lanes (a saved session holding one still loads)."""
    lane = Lane(**{key: value})
    assert unread_keys(lane) == [key]
    assert differences(lane, Lane()) == []
    assert lane_from_dict(lane.as_dict()) == lane
    served = Lane(**{**SERVER, key: value})
    assert unread_keys(served) == [] and getattr(served, key) == value


@pytest.mark.parametrize(("value", "expected"), [(True, "true"), (False, ""), ("false", "")])
def test_chat_takes_toml_booleans_as_repack_does(value: object, expected: str) -> None:
    assert Lane(chat=value).chat == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[pairs.x]\na = { n_ubatchh = 1 }\n", "pairs.x.a: unknown lane key 'n_ubatchh'"),
        ("[pairs.x]\nfrom = 'nope'\n", "unknown pair 'nope'"),
        ("[pairs.x]\nb = { n_ubatch = 0 }\n", "pairs.x.b: lane key 'n_ubatch' must be between"),
        ("[pairs.x]\nc = {}\n", "unknown key 'c'"),
        ("[lanes]\n", "unknown table 'lanes'"),
        ("[pairs.x\n", "not valid TOML"),
    ],
)
def test_bad_pairs_files(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "pairs.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(LaneConfigError, match=message):
        load_pairs_file(path)


def test_missing_pairs_file(tmp_path: Path) -> None:
    with pytest.raises(LaneConfigError, match="pairs file not found"):
        load_pairs_file(tmp_path / "absent.toml")


SERVER = {"backend": "server", "endpoint": "http://h:1"}


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"backend": "server"}, "a server lane needs endpoint=http://HOST:PORT"),
        ({"backend": "server", "endpoint": "localhost:8080"}, "needs endpoint=http"),
        (
            {"backend": "server", "endpoint": "http://h:1", "speculation": "ngram"},
            "speculation is the server's own setting",
        ),
        (
            {"backend": "server", "endpoint": "http://h:1", "prefix": "cached"},
            "set api=llama-server",
        ),
        ({**SERVER, "api_key_env": "MY KEY"}, "api_key_env must name an environment variable"),
        ({**SERVER, "request": "[1, 2]"}, "request must be a JSON object"),
        ({**SERVER, "request": "{oops"}, "request must be a JSON object"),
        ({**SERVER, "api": "grpc"}, "lane key 'api' cannot be 'grpc'"),
        ({**SERVER, "timeout": 0}, "lane key 'timeout' must be between 1 and 3600"),
    ],
)
def test_server_lane_settings_are_checked(settings: dict, message: str) -> None:
    with pytest.raises(LaneConfigError, match=message):
        Lane(**settings)


def test_a_server_lane_round_trips_through_a_session_dict() -> None:
    lane = Lane(
        backend="server",
        endpoint="http://127.0.0.1:8080",
        api="llama-server",
        api_key_env="MY_KEY",
        request='{"cache_prompt": true}',
        prefix="cached",
    )
    assert lane_from_dict(lane.as_dict()) == lane
    assert lane.describe() == "prefix cached"
    assert Lane(backend="server", endpoint="http://h:1").describe() == "server http://h:1"


@pytest.mark.parametrize("text", ["１", "1_0", "٣", "1.0", "0x10", "", "+-1"])
def test_a_whole_number_key_takes_ascii_digits_only(text: str) -> None:
    with pytest.raises(LaneConfigError, match="a whole number"):
        parse_overrides([f"n_ubatch={text}"])


@pytest.mark.parametrize(("text", "value"), [("2", 2), (" 2 ", 2), ("+2", 2), ("-1", -1)])
def test_a_whole_number_key_reads_plain_digits(text: str, value: int) -> None:
    assert parse_overrides([f"gpu_layers={text}"]) == {"gpu_layers": value}


@pytest.mark.parametrize("option", ["--both", "--lane-a", "--lane-b"])
def test_a_bad_override_names_its_lane(option: str) -> None:
    """--both reaches both lanes: the error says which of them refused."""
    from specdiff.cli import build_parser
    from specdiff.cli.common import known_pairs, resolve_pair

    args = build_parser().parse_args(["run", "--pair", "servers", option, "gpu_layers=-1"])
    with pytest.raises(LaneConfigError) as raised:
        resolve_pair(args, known_pairs(args))
    lane_id = "b" if option == "--lane-b" else "a"
    assert str(raised.value).startswith(f"lane {lane_id}: gpu_layers does not apply")


def test_a_lane_moved_to_another_backend_keeps_its_settings(tmp_path: Path) -> None:
    """A lane that a later table or the command line moves keeps what it had: a server
    key it took is unread in-process, and an in-process key a server lane cannot take
    is refused with the lane named (the pair may compare exactly that key)."""
    from specdiff.cli import build_parser
    from specdiff.cli.common import known_pairs, resolve_pair

    path = tmp_path / "pairs.toml"
    path.write_text(
        '[defaults]\ntimeout = 3\nchat = "chatml"\n\n'
        '[pairs.mixed]\na = { backend = "server", endpoint = "http://127.0.0.1:9" }\n\n'
        '[pairs.chain]\nfrom = "mixed"\na = { backend = "local", endpoint = "" }\n',
        encoding="utf-8",
    )
    pairs = load_pairs_file(path)
    assert (pairs["mixed"].a.timeout, pairs["mixed"].a.chat) == (3, "")
    chain = pairs["chain"].a
    assert (chain.backend, chain.timeout, unread_keys(chain)) == ("local", 3, ["timeout"])
    served = ["--lane-a", "backend=server", "--lane-a", "endpoint=http://h:1"]
    args = build_parser().parse_args(["run", "--pairs", str(path), "--pair", "ubatch", *served])
    with pytest.raises(LaneConfigError, match="^lane a: a server lane's chat template"):
        resolve_pair(args, known_pairs(args))
    both = ["--both", "backend=server", "--both", "endpoint=http://h:1"]
    args = build_parser().parse_args(["run", "--pair", "spec-vs-plain", *both])
    with pytest.raises(LaneConfigError, match="^lane a: .*speculation"):
        resolve_pair(args, known_pairs(args))


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("n_ubatch=2  repack=off", ["n_ubatch=2", "repack=off"]),
        ("label=llama-server --spec-type x", ["label=llama-server --spec-type x"]),
        ('request={"cache_prompt": true, "seed": 0} top_k=4',
         ['request={"cache_prompt": true, "seed": 0}', "top_k=4"]),
        ("model=C:\\models\\my model.gguf", ["model=C:\\models\\my model.gguf"]),
        ("label=Bob's lane", ["label=Bob's lane"]),
        ("   ", []),
    ],
)  # fmt: skip
def test_override_words_start_a_setting_only_at_key_equals(text: str, words: list[str]) -> None:
    from specdiff.lanes import override_words

    assert override_words(text) == words
