"""`specdiff doctor`: what this machine runs (specdiff, llama.cpp, the CPU, llama-server,
Chromium, the paths) and what is wrong with it, one line per problem with its fix.

Exit 0 when nothing is wrong, 1 when something is (warnings do not count), 2 on bad
input. `--json` prints the same as one object, for a bug report.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from specdiff.cli import options
from specdiff.cli.common import Exit, Status, Subcommands, add_command

UNHEALTHY = Exit.DIFFERENT
"""Something is wrong: 1, like lanes that differ; 2 stays for bad input."""


def add_parser(commands: Subcommands) -> None:
    doctor = add_command(
        commands,
        "doctor",
        "check llama.cpp, llama-server, the CPU and the paths; exit 1 when something is wrong",
        command_doctor,
    )
    options.add_model(doctor)
    doctor.add_argument("--llama-server", metavar="PATH", help="the llama-server binary")
    doctor.add_argument("--json", action="store_true", help="one JSON object, for a bug report")


def command_doctor(args: argparse.Namespace) -> int:
    # deferred: the engine modules load only for the command that runs
    from specdiff.doctor import examine

    status = Status(sys.stderr, True)
    status.update("specdiff doctor: checking llama.cpp and llama-server")
    checkup = examine(args.llama_server, args.model)
    status.done()
    if args.json:
        # ensure_ascii: every control character from outside arrives as an escape
        print(json.dumps(checkup.as_dict(), indent=2, ensure_ascii=True))
    else:
        print("\n".join(report_lines(checkup.as_dict())))
    return Exit.SAME if checkup.healthy else UNHEALTHY


def report_lines(report: dict[str, Any]) -> list[str]:
    """The checkup for reading: one fact a line, then warnings and problems."""
    llama, probe, server = report["llama.cpp"], report["probe"], report["llama-server"]
    paths = report["paths"]
    rows = [
        ("specdiff", report["specdiff"]["version"]),
        ("llama-cpp-python", llama.get("llama_cpp_python")),
        ("llama.cpp", llama.get("build")),
        ("CPU", f"{shown(llama.get('cpu'))} · {llama.get('cores')} cores"),
        ("CPU features", " ".join(llama.get("cpu_features") or []) or None),
        ("system info", llama.get("system_info")),
        ("GPU offload", _offload_text(llama.get("gpu_offload"))),
        ("devices", _devices_text(llama.get("devices"))),
        ("probe", _probe_text(probe)),
        ("model", report["model"].get("path")),
        ("model sha256", report["model"].get("sha256")),
        ("llama-server", server.get("path")),
        ("its version", " · ".join((server.get("version") or "").splitlines()) or None),
        ("its start", _server_probe_text(server.get("probe"))),
        ("chromium", report["chromium"].get("path") or "not on PATH"),
        ("cache", _path_text(paths["cache"])),
        ("sessions", _path_text(paths["sessions"])),
        ("config", _config_text(paths["config"])),
    ]
    lines = [f"{name:<17} {shown(value) if value is not None else '—'}" for name, value in rows]
    lines.append("")
    lines += [f"warning: {_problem_line(w)}" for w in report["warnings"]]
    lines += [f"problem: {_problem_line(p)}" for p in report["problems"]]
    verdict = "healthy" if report["healthy"] else f"{len(report['problems'])} problem(s)"
    lines.append(f"{verdict}; checked in {report['seconds']:.1f} s")
    return lines


def shown(value: object) -> str:
    """Text from outside (a binary's output, a path, system info) safe for a terminal:
    C0 controls as their control pictures, other unprintable characters (C1 controls,
    bidirectional overrides) as \\u escapes."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(_visible_character(character) for character in text)


def _visible_character(character: str) -> str:
    if character.isprintable():
        return character
    code = ord(character)
    if code < 0x20:
        return chr(0x2400 + code)
    if code == 0x7F:
        return "\u2421"
    return f"\\u{code:04x}"


def _problem_line(problem: dict[str, str]) -> str:
    line = f"{problem['check']}: {problem['message']}"
    return shown(line + (f"; fix: {problem['fix']}" if problem["fix"] else ""))


def _probe_text(probe: dict[str, Any]) -> str | None:
    if "skipped" in probe:
        return f"skipped: {probe['skipped']}"
    if "chosen_repack" not in probe:
        return None
    cached = " (cached)" if probe.get("cached") else ""
    return f"{probe.get('message') or 'repack ' + (probe['chosen_repack'] or 'fails')}{cached}"


def _offload_text(offload: object) -> str | None:
    if offload is None:
        return None
    if offload:
        return "yes (lanes may set gpu_layers; -1 = every layer)"
    # deferred: the runtime module is the engine's; only its install line is wanted
    from specdiff.engine.runtime import GPU_BUILD

    return f"no: this llama-cpp-python is CPU-only; for a GPU: {GPU_BUILD}"


def _devices_text(devices: object) -> str | None:
    """Each device llama.cpp registered: name, description, type and total memory."""
    if not isinstance(devices, list):
        return None
    return " · ".join(
        f"{device.get('name')} {device.get('description')} ({device.get('type')}, "
        f"{int(device.get('memory_total') or 0) / 2**30:.1f} GiB)"
        for device in devices
        if isinstance(device, dict)
    )


def _server_probe_text(probe: dict[str, Any] | None) -> str | None:
    if probe is None:
        return None
    repack = "repack on" if probe["repack"] else "--no-repack"
    cached = ", cached" if probe.get("cached") else ""
    return f"healthy in {probe['seconds']:.1f} s ({repack}{cached})"


def _path_text(path: dict[str, Any]) -> str | None:
    if path["path"] is None:
        return None
    return f"{path['path']} ({'writable' if path['writable'] else 'NOT writable'})"


def _config_text(config: dict[str, Any]) -> str:
    state = "absent" if not config["exists"] else "ok" if config["valid"] else "INVALID"
    return f"{config['path']} ({state})"
