"""Real lm-evaluation-harness and promptfoo runs against two llama-servers that may fork:
the server test runs them, and `python3 -m tests.eval_runs` made the committed copies in
tests/data/imports/ the fast tier reads.

The two servers serve the bundled model with one thread and one slot each; lane b also processes the
prompt two tokens at a time (`--batch-size 2 --ubatch-size 2`), which changes the kernels
the prompt goes through and so, on some prompts, the greedy text.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from specdiff.engine.models import bundled_model_path
from specdiff.engine.server.process import LlamaServer, find_llama_server
from tests.node_clients import PROMPTFOO

DATA = Path(__file__).parent / "data" / "imports"

MODEL_NAME = "gemma-3-270m"
TASK = "facts"
ITEMS = (
    ("The capital of France is", "Paris"),
    ("The largest planet in the solar system is", "Jupiter"),
    ("Water freezes at a temperature of", "0"),
    ("The author of Romeo and Juliet is", "William"),
    ("The chemical symbol for gold is", "Au"),
    ("The first president of the United States was", "George"),
    ("The Roman Empire was founded in", "27"),
    ('def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n', "if"),
    ("Once upon a time, in a small village by the sea, there lived", "a"),
    ("The square root of 144 is", "12"),
    ("The tallest mountain on Earth is", "Everest"),
    ("List the days of the week: Monday, Tuesday,", "Wednesday"),
)
"""Prompts and the word a right answer holds (`contains`) or starts with (`exact_match`)."""
TASK_YAML = """\
task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: {until}
  max_gen_toks: {max_tokens}
  do_sample: false
  temperature: 0
process_results: !function grading.process_results
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
  - metric: contains
    aggregation: mean
    higher_is_better: true
"""
GRADING = """\
import re


def process_results(doc, results):
    answer = doc["answer"].lower()
    text = results[0]
    first = re.search(r"[A-Za-z0-9]+", text)
    return {
        "exact_match": float(first is not None and first.group(0).lower() == answer),
        "contains": float(answer in text.lower()),
    }
"""
PROMPTFOO_YAML = """\
prompts:
  - "{{{{question}}}}"
providers:
  - id: openai:completion:{model}
    config:
      apiBaseUrl: {url}/v1
      max_tokens: {max_tokens}
      temperature: 0
tests: file://{tests}
"""
LANE_ARGUMENTS = (
    ("--threads", "1", "--parallel", "1"),
    ("--threads", "1", "--parallel", "1", "--batch-size", "2", "--ubatch-size", "2"),
)


@contextlib.contextmanager
def two_servers() -> Iterator[tuple[str, str]]:
    """Lane a's and lane b's llama-server, started on loopback; their base URLs."""
    binary = find_llama_server()
    model = bundled_model_path()
    a = LlamaServer(binary, model, ["--no-cache-prompt", *LANE_ARGUMENTS[0]])
    b = LlamaServer(binary, model, ["--no-cache-prompt", *LANE_ARGUMENTS[1]])
    with a, b:
        yield a.url, b.url


def offline_env(home: Path) -> dict[str, str]:
    return {
        **os.environ,
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(home / "hf"),
        "PROMPTFOO_DISABLE_TELEMETRY": "1",
        "PROMPTFOO_DISABLE_UPDATE": "1",
        "PROMPTFOO_CONFIG_DIR": str(home / "promptfoo"),
        "OPENAI_API_KEY": "dummy",
    }


def write_task(
    folder: Path,
    max_tokens: int,
    items: Sequence[tuple[str, str]] = ITEMS,
    until: Sequence[str] = ("\n\n",),
) -> Path:
    """The lm-eval task's YAML and JSONL in `folder` (`items` as (prompt, answer), each
    answer cut at the first of `until`); the folder for --include_path."""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "items.jsonl"
    lines = (json.dumps({"question": q, "answer": a}) for q, a in items)
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    stops = json.dumps(list(until))  # a JSON list is a YAML flow sequence
    yaml = TASK_YAML.format(task=TASK, data=data, max_tokens=max_tokens, until=stops)
    (folder / f"{TASK}.yaml").write_text(yaml, encoding="utf-8")
    (folder / "grading.py").write_text(GRADING, encoding="utf-8")
    return folder


def run_lm_eval(url: str, task_dir: Path, output: Path, home: Path) -> Path:
    """lm-eval's `--log_samples` run of the task against the server at `url`; the
    folder holding its results and samples files."""
    model_args = (
        f"base_url={url}/v1/completions,model={MODEL_NAME},"
        "tokenizer_backend=None,tokenized_requests=False"
    )
    command = [
        sys.executable, "-m", "lm_eval", "--model", "local-completions",
        "--model_args", model_args, "--tasks", TASK, "--include_path", str(task_dir),
        "--log_samples", "--output_path", str(output), "--batch_size", "1",
    ]  # fmt: skip
    subprocess.run(command, env=offline_env(home), check=True, capture_output=True)
    return output


def run_promptfoo(url: str, folder: Path, output: Path, home: Path, max_tokens: int) -> Path:
    """promptfoo's eval of the same items against the server at `url`, written to
    `output`; its exit status 100 (a test failed) is a result, not an error."""
    folder.mkdir(parents=True, exist_ok=True)
    tests = [
        {"vars": {"question": q}, "assert": [{"type": "icontains", "value": a}]} for q, a in ITEMS
    ]
    (folder / "tests.json").write_text(json.dumps(tests), encoding="utf-8")
    config = folder / "promptfooconfig.yaml"
    config.write_text(
        PROMPTFOO_YAML.format(
            model=MODEL_NAME, url=url, max_tokens=max_tokens, tests=folder / "tests.json"
        ),
        encoding="utf-8",
    )
    command = [str(PROMPTFOO), "eval", "-c", str(config), "-o", str(output), "--no-cache"]
    done = subprocess.run(command, env=offline_env(home), capture_output=True, cwd=folder)
    if done.returncode not in (0, 100):
        raise RuntimeError(f"promptfoo exited {done.returncode}: {done.stderr[-2000:]!r}")
    return output


def make_data(work: Path, max_tokens: int = 48) -> None:
    """Run both tools against both servers and copy their outputs into tests/data."""
    task_dir = write_task(work / "task", max_tokens)
    with two_servers() as urls:
        for lane, url in zip("ab", urls, strict=True):
            run_lm_eval(url, task_dir, work / f"lm-eval-{lane}", work)
            run_promptfoo(
                url, work / f"pf-{lane}", work / f"promptfoo-{lane}.json", work, max_tokens
            )
    for lane in "ab":
        target = DATA / f"lm-eval-{lane}"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(work / f"lm-eval-{lane}", target)
        shutil.copy(work / f"promptfoo-{lane}.json", DATA / f"promptfoo-{lane}.json")


if __name__ == "__main__":
    make_data(Path(sys.argv[1]))
