"""GPU lanes: the offload keys refused with one line where they cannot apply, the executed
record of where the layers went, and, where llama.cpp can offload, a GPU lane's tokens
checked against llama-cpp-python's own generate loop with every layer on the GPU.

The GPU tests skip with their reason on a CPU-only build. SPECDIFF_TEST_MODEL names a
small GGUF to use instead of the bundled model (a GPU box may not carry that package).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdiff.cli import main
from specdiff.sessions.store import Session, load_session
from tests.in_process import specdiff_here
from tests.test_cli import assert_one_line_error, specdiff
from tests.test_engine import llama_generate
from tests.tui_driver import drive

INSTALL_LINES = ('CMAKE_ARGS="-DGGML_CUDA=on"', "-DGGML_METAL=on", "-DGGML_VULKAN=on")
MODEL_ENV = "SPECDIFF_TEST_MODEL"
PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n    " + "# return the n-th Fibonacci number, iteratively\n    " * 6,
)
"""A short prompt, and one long enough that its first batch is many rows wide."""


@pytest.fixture(scope="module")
def gguf() -> Path:
    """SPECDIFF_TEST_MODEL, else the bundled model."""
    given = os.environ.get(MODEL_ENV)
    if given:
        return Path(given).expanduser().resolve()
    # deferred: resolving the bundled model is the model tier's work, not collection's
    from specdiff.engine.models import bundled_model_path

    return bundled_model_path()


def offload_supported() -> bool:
    # deferred: loads llama.cpp, which only model tests may
    from specdiff.engine.runtime import supports_gpu_offload

    return supports_gpu_offload()


def require_cpu_build() -> None:
    if offload_supported():
        pytest.skip("this llama-cpp-python can offload to a GPU: nothing to refuse here")


def run_saved(folder: Path, *args: str) -> tuple[Session, str]:
    """`specdiff run ARGS --save` into `folder`: the session it wrote, and its report."""
    completed = specdiff("run", *args, "--save", "--sessions-dir", str(folder), "--quiet")
    assert completed.returncode in (0, 1), completed.stderr
    (path,) = folder.glob("*.jsonl")
    return load_session(path), completed.stdout


# --- the keys' values, checked before anything loads ----------------------------------


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--lane-a", "gpu_layers=-2"), "'gpu_layers' must be between -1 and"),
        (("--lane-a", "gpu_layers=all"), "'gpu_layers' must be a whole number"),
        (("--lane-b", "main_gpu=256"), "'main_gpu' must be between 0 and 255"),
        (("--both", "split_mode=rows"), "allowed: 'none', 'layer', 'row'"),
        (("--pair", "servers", "--lane-a", "gpu_layers=99"), "llama-server -ngl 99"),
        (("--pair", "servers", "--lane-b", "main_gpu=1"), "keep main_gpu=0"),
        (("--pair", "servers", "--lane-b", "split_mode=row"), "keep split_mode=layer"),
    ],
)
def test_bad_offload_values_are_one_line_and_exit_2(args: tuple[str, ...], fragment: str) -> None:
    completed = specdiff_here("run", *args, "--prompt", "Hello", "--max-tokens", "4")
    assert_one_line_error(completed, fragment)
    assert "loading lane" not in completed.stderr


@pytest.mark.parametrize(
    ("table", "fragment"),
    [
        ('a = { gpu_layers = "all" }', "'gpu_layers' must be a whole number"),
        ("b = { main_gpu = 1.5 }", "'main_gpu' must be a whole number"),
        ('a = { split_mode = "tensor" }', "'split_mode' cannot be 'tensor'"),
    ],
)
def test_a_pairs_file_with_bad_offload_values_names_file_and_pair(
    tmp_path: Path, table: str, fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # the command line's own entry point in this process: the exit path is the one the
    # real processes above take, and the fast tier stays fast
    pairs = tmp_path / "pairs.toml"
    pairs.write_text(f"[pairs.mine]\n{table}\n", encoding="utf-8")
    code = main(["run", "--pairs", str(pairs), "--pair", "mine", "--max-tokens", "4"])
    error = capsys.readouterr().err
    assert code == 2 and error.count("\n") == 1 and error.startswith("specdiff: error: ")
    assert all(part in error for part in (str(pairs), "pairs.mine.", fragment)), error


# --- a CPU-only build --------------------------------------------------------------------


@pytest.mark.model
@pytest.mark.parametrize("gpu_layers", ["-1", "1"])
@pytest.mark.parametrize("command", ["run", "repeat"])
def test_a_cpu_build_refuses_gpu_layers_before_any_lane_loads(
    command: str, gpu_layers: str, gguf: Path
) -> None:
    require_cpu_build()
    lane_option = "--lane-a" if command == "run" else "--lane"
    completed = specdiff(
        command,
        lane_option,
        f"gpu_layers={gpu_layers}",
        "--model",
        str(gguf),
        "--prompt",
        "Hello",
        "--max-tokens",
        "4",
    )
    assert_one_line_error(completed, f"gpu_layers={gpu_layers}", *INSTALL_LINES)
    assert "loading lane" not in completed.stderr


@pytest.mark.model
def test_a_cpu_build_refuses_the_gpu_vs_cpu_preset_in_verify_and_suite(
    tmp_path: Path, gguf: Path
) -> None:
    """verify of a session recorded on a GPU box, and a suite naming the preset: the same
    line; the suite skips the pair (its other pairs would still run) and says why."""
    require_cpu_build()
    session, _ = run_saved(
        tmp_path / "cpu", "--pair", "ubatch", "--model", str(gguf), "--max-tokens", "4"
    )
    lines = session.path.read_text(encoding="utf-8").splitlines()
    header = json.loads(lines[0])
    header["lanes"]["a"]["gpu_layers"] = -1
    recorded_on_gpu = tmp_path / "gpu.jsonl"
    recorded_on_gpu.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    assert_one_line_error(specdiff("verify", str(recorded_on_gpu)), "gpu_layers=-1", *INSTALL_LINES)

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "p1", "prompt": "Hello"}\n', encoding="utf-8")
    suite = specdiff(
        "suite",
        str(prompts),
        "--pair",
        "gpu-vs-cpu",
        "--model",
        str(gguf),
        "--max-tokens",
        "4",
        "--report",
        str(tmp_path / "report"),
    )
    assert suite.returncode == 1 and "Traceback" not in suite.stderr, suite.stderr
    (skipped,) = [line for line in suite.stderr.splitlines() if line.startswith("skipped")]
    assert "gpu_layers=-1" in skipped and all(part in skipped for part in INSTALL_LINES)


@pytest.mark.model
async def test_the_tui_shows_the_refusal_in_the_gpu_lane_pane(gguf: Path) -> None:
    require_cpu_build()
    # deferred: the app's modules are the TUI's, loaded for this test alone
    from specdiff.lanes import presets
    from specdiff.tui.app import make_app
    from specdiff.tui.widgets import Line, TokenView
    from tests.conftest import wait_for

    app = make_app(presets(), "gpu-vs-cpu", "Hello", 4)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: drive(app).lanes["a"].error is not None)
        await pilot.pause()
        assert "CMAKE_ARGS" in drive(app).lanes["a"].error and drive(app).lanes["b"].error is None
        trailer = app.query_one("#lane-a TokenView", TokenView).trailer
        assert trailer is not None and "gpu_layers=-1" in trailer
        assert not drive(app).running
        status = app.query_one("#status", Line).plain
        assert status.startswith("failed: lane a asks for") and status.count("lane a") == 1


# --- what a session records --------------------------------------------------------------


@pytest.mark.model
@pytest.mark.parametrize(
    "offload",
    [
        (),
        ("--lane-a", "split_mode=none", "--lane-b", "split_mode=row", "--lane-b", "main_gpu=1"),
    ],
)
def test_a_cpu_session_records_the_devices_and_no_offloaded_layer(
    tmp_path: Path, gguf: Path, offload: tuple[str, ...]
) -> None:
    session, report = run_saved(
        tmp_path, "--pair", "ubatch", "--model", str(gguf), "--prompt", PROMPTS[0],
        "--max-tokens", "16", *offload,
    )  # fmt: skip
    supported = offload_supported()
    for lane_id in ("a", "b"):
        lane, executed = getattr(session.pair, lane_id), session.header.executed[lane_id]
        assert executed["gpu_layers"] == lane.gpu_layers == 0
        assert (executed["main_gpu"], executed["split_mode"]) == (lane.main_gpu, lane.split_mode)
        assert executed["gpu_offload"] is supported
        assert executed["layers_offloaded"] == 0 and executed["layers_total"] > 1
        devices = executed["devices"]
        assert any(device["type"] == "cpu" for device in devices), devices
        for device in devices:
            assert device["name"] and isinstance(device["description"], str)
            assert 0 <= device["memory_free"] <= device["memory_total"]
    assert "layers on the GPU" not in report
    # one list for the whole process: the pair's lanes never differ in it
    assert session.header.executed["a"]["devices"] == session.header.executed["b"]["devices"]


# --- a GPU -------------------------------------------------------------------------------


@pytest.mark.model
@pytest.mark.parametrize("prompt", PROMPTS)
def test_gpu_lane_offloads_every_layer_and_equals_llama_on_the_gpu(
    tmp_path: Path, gguf: Path, prompt: str
) -> None:
    """The numbers are verified: lane a of gpu-vs-cpu generates what llama-cpp-python's
    Llama generates with every layer on the GPU, and its record says the layers went."""
    if not offload_supported():
        pytest.skip(
            "this llama-cpp-python cannot offload to a GPU (llama_supports_gpu_offload() is "
            "false): install it with CUDA, Metal or Vulkan to run the GPU lanes"
        )
    # deferred: collecting the fast tier must not load llama.cpp
    from llama_cpp import Llama

    session, report = run_saved(
        tmp_path,
        "--pair",
        "gpu-vs-cpu",
        "--model",
        str(gguf),
        "--prompt",
        prompt,
        "--max-tokens",
        "32",
    )
    gpu, cpu = session.header.executed["a"], session.header.executed["b"]
    assert gpu["gpu_offload"] is True and gpu["gpu_layers"] == -1
    assert gpu["layers_offloaded"] == gpu["layers_total"] > 0
    assert cpu["layers_offloaded"] == 0
    layers = f"{gpu['layers_offloaded']}/{gpu['layers_total']} layers on the GPU"
    (line,) = [line for line in report.splitlines() if layers in line]
    assert line.lstrip().startswith("lane a:")
    assert any(device["type"] in ("gpu", "igpu") for device in gpu["devices"]), gpu["devices"]
    ours = [step.token_id for step in session.steps["a"]]
    assert ours and not session.footer.errors[0]
    lane = session.pair.a
    llm = Llama(
        str(gguf),
        n_gpu_layers=-1,
        n_ctx=lane.n_ctx,
        n_batch=lane.n_batch,
        n_ubatch=lane.n_ubatch,
        n_threads=gpu["threads"],
        n_threads_batch=gpu["threads_batch"],
        verbose=False,
    )
    try:
        assert ours == llama_generate(llm, list(session.header.prompt_token_ids), len(ours))
    finally:
        llm.close()


@pytest.mark.model
def test_doctor_says_whether_llama_cpp_can_offload() -> None:
    """The doctor's child reports offload support and the devices, as the engine sees them."""
    # deferred: the doctor's child loads llama.cpp
    from specdiff.doctor import LLAMA_CHILD
    from specdiff.engine.runtime import backend_devices

    completed = subprocess.run(
        [sys.executable, "-c", LLAMA_CHILD, ""],
        capture_output=True,
        text=True,
        timeout=120,
    )
    facts = {}
    for line in completed.stdout.splitlines():
        facts.update(json.loads(line))
    assert facts["gpu"]["offload"] is offload_supported()
    names = [(device["name"], device["type"]) for device in facts["gpu"]["devices"]]
    assert names == [(device["name"], device["type"]) for device in backend_devices()]


# --- what the run's report says -----------------------------------------------------------

CPU_DEVICE = {"name": "CPU", "description": "AMD EPYC", "type": "cpu"}
H200 = {"name": "CUDA0", "description": "NVIDIA H200", "type": "gpu"}
HOSTILE_GPU = {"name": "CUDA0", "description": "\x1b[31mred\x07", "type": "gpu"}


def placement(asked: int, offloaded: int, total: int, *devices: dict) -> dict[str, object]:
    """A lane's executed values about offload, as LoadedModel records them."""
    return {
        "gpu_layers": asked,
        "layers_offloaded": offloaded,
        "layers_total": total,
        "devices": list(devices),
    }


@pytest.mark.parametrize(
    ("executed", "expected"),
    [
        (placement(-1, 19, 19, CPU_DEVICE, H200), "19/19 layers on the GPU (NVIDIA H200)"),
        (
            placement(8, 8, 29, {"name": "Vulkan0", "type": "igpu"}, {"name": "V1", "type": "gpu"}),
            "8/29 layers on the GPU (Vulkan0, V1)",
        ),
        (placement(-1, 19, 19, HOSTILE_GPU), "19/19 layers on the GPU (\\x1b[31mred\\x07)"),
        (placement(0, 0, 19, CPU_DEVICE), None),
        ({}, None),  # a session recorded before GPU lanes
    ],
)
def test_the_report_says_where_a_gpu_lane_put_its_layers(
    executed: dict[str, object], expected: str | None
) -> None:
    # deferred: the demo sessions' reader lives with the verdict tests
    from specdiff.reports.text import format_result
    from tests.test_verdict import DEMOS, result_of

    result = result_of(DEMOS[0])
    result.a.executed = {"model_path": "m.gguf", **executed}
    result.b.executed = {"model_path": "m.gguf", **executed, "gpu_layers": 0}
    lines = format_result(result).splitlines()
    (lane_a,) = [line for line in lines if line.startswith("  lane a: ") and "m.gguf" in line]
    (lane_b,) = [line for line in lines if line.startswith("  lane b: ") and "m.gguf" in line]
    assert "layers on the GPU" not in lane_b and "\x1b" not in lane_a
    if expected is None:
        assert "layers on the GPU" not in lane_a
    else:
        assert lane_a.endswith(expected), lane_a
