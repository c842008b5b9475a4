"""A suite's prompts: read from a JSONL file, a folder of .txt files or a bundled set,
each checked, with ids that name distinct session files."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from specdiff import prompts as bundled
from specdiff.chat import Conversation, parse_messages
from specdiff.errors import did_you_mean
from specdiff.file_values import MAX_TOKENS, BadValue, whole_number
from specdiff.grading.graders import Grader, grader_from
from specdiff.safe_text import first_surrogate
from specdiff.sessions.store import safe_name
from specdiff.suite import SuiteError

Report = Callable[[str], None]
"""Takes one problem with the prompts: raises it, or notes it and goes on."""


@dataclass(frozen=True)
class SuitePrompt:
    id: str
    prompt: str
    max_tokens: int | None = None
    where: str = ""
    """File and line (or file) it came from, for messages."""
    grader: Grader | None = None
    stop: tuple[str, ...] = ()
    """Stop strings of this prompt, beside the suite's own (--stop)."""

    @property
    def file_stem(self) -> str:
        return safe_name(self.id)


def load_suite_prompts(source: str, skip_bad: bool = False) -> tuple[list[SuitePrompt], list[str]]:
    """Prompts from a JSONL file ({"id", "prompt", "max_tokens"?} a line), a folder of
    .txt files (id = file name), or a bundled set's name. Returns the prompts and the
    problems skipped (only with `skip_bad`; otherwise the first problem is raised)."""
    path = Path(source).expanduser()
    problems: list[str] = []

    def bad(message: str) -> None:
        if not skip_bad:
            raise SuiteError(f"{message} (fix it, or pass --skip-bad to run the rest)")
        problems.append(message)

    if path.is_dir():
        entries, where = _folder_prompts(path, bad)
    elif path.is_file():
        entries, where = _jsonl_prompts(path, bad), str(path)
    elif source in bundled.SETS:
        entries, where = _bundled_prompts(source), f"the bundled set {source!r}"
    else:
        raise SuiteError(
            f"no prompt file, folder or bundled set named {source!r} "
            f"({did_you_mean(source, bundled.SETS)}bundled sets: {', '.join(bundled.SETS)})"
        )
    unique = _distinct_files(entries, bad)
    if not unique:
        raise SuiteError(f"{where} holds no prompts; give at least one")
    return unique, problems


def prompts_digest(prompts: Sequence[SuitePrompt]) -> str:
    """What a resumed suite checks its prompts against; a prompt's grader and stop
    strings count only where it has them, so older suites' digests stay the same."""
    text = json.dumps([_digested(p) for p in prompts], ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _digested(prompt: SuitePrompt) -> list[object]:
    fields: list[object] = [prompt.id, prompt.prompt, prompt.max_tokens]
    if isinstance(prompt.prompt, Conversation):
        fields.append(prompt.prompt.to_json())
    if prompt.grader is not None or prompt.stop:
        fields += [prompt.grader.as_json() if prompt.grader else None, list(prompt.stop)]
    return fields


def select_prompts(
    prompts: Sequence[SuitePrompt], ids: Sequence[str], limit: int | None, where: str
) -> list[SuitePrompt]:
    """The prompts named by `ids` (all when none are named), in the set's order, then
    the first `limit` of them."""
    chosen = list(prompts)
    if ids:
        known = {p.id for p in prompts}
        missing = [i for i in ids if i not in known]
        if missing:
            raise SuiteError(
                f"--ids names {missing[0]!r}, which {where} does not hold "
                f"(its first ids: {', '.join(p.id for p in prompts[:3])})"
            )
        wanted = set(ids)
        chosen = [p for p in prompts if p.id in wanted]
    return chosen[:limit] if limit is not None else chosen


def _folder_prompts(path: Path, bad: Report) -> tuple[list[SuitePrompt], str]:
    """One prompt a .txt file, named by the file; and how to name the folder in messages."""
    files = sorted(path.glob("*.txt"))
    entries = []
    for file in files:
        try:
            text = file.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            bad(f"{file}: not UTF-8 text")
            continue
        except OSError as error:
            bad(f"{file}: cannot read it ({error.strerror})")
            continue
        # an editor's final newline is not part of the prompt
        text = text[:-1] if text.endswith("\n") else text
        if not text.strip():
            bad(f"{file}: the prompt is empty")
            continue
        entries.append(SuitePrompt(file.stem, text, None, str(file)))
    return entries, f"{path} (no .txt files)" if not files else str(path)


def _jsonl_prompts(path: Path, bad: Report) -> list[SuitePrompt]:
    try:
        raw_lines = path.read_bytes().split(b"\n")
    except OSError as error:
        raise SuiteError(f"cannot read {path}: {error.strerror}") from None
    entries = []
    for number, raw in enumerate(raw_lines, 1):
        if not raw.strip():
            continue
        entry = _prompt_line(path, number, raw, bad)
        if entry is not None:
            entries.append(entry)
    return entries


def _bundled_prompts(name: str) -> list[SuitePrompt]:
    try:
        items = bundled.load(name)
    except bundled.MissingSet as error:
        raise SuiteError(str(error)) from None

    def broken(message: str) -> None:
        raise SuiteError(f"the bundled set is damaged: {message}; reinstall specdiff")

    entries = [_prompt_from(item, f"{name}:{n}", broken) for n, item in enumerate(items, 1)]
    return [entry for entry in entries if entry is not None]


def _distinct_files(entries: Sequence[SuitePrompt], bad: Report) -> list[SuitePrompt]:
    """The prompts whose ids name a session file no earlier prompt names (file names
    are compared without case: some file systems ignore it)."""
    unique: list[SuitePrompt] = []
    seen: dict[str, SuitePrompt] = {}
    for entry in entries:
        first = seen.get(entry.file_stem.lower())
        if first is not None:
            same = "duplicate id" if first.id == entry.id else "an id that names the same file as"
            bad(f"{entry.where}: {same} {entry.id!r} (first at {first.where})")
            continue
        seen[entry.file_stem.lower()] = entry
        unique.append(entry)
    return unique


def _prompt_line(path: Path, number: int, raw: bytes, bad: Report) -> SuitePrompt | None:
    where = f"{path}:{number}"
    try:
        record = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        bad(f"{where}: not UTF-8 text")
        return None
    except ValueError as error:
        bad(f"{where}: not valid JSON ({error.args[0].split(':')[0]})")
        return None
    return _prompt_from(record, where, bad)


def _prompt_or_messages(record: dict[str, object]) -> str:
    """A line's "prompt", or its "messages" as a conversation; ValueError naming the
    field."""
    prompt, messages = record.get("prompt"), record.get("messages")
    if messages is None:
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError('missing "prompt" (a non-empty string) or "messages" (a list)')
        return prompt
    if prompt is not None:
        raise ValueError('give "prompt" or "messages", not both')
    conversation = Conversation(parse_messages(messages, '"messages"'))
    if not conversation.strip():
        raise ValueError('"messages" holds no text; give the messages some content')
    return conversation


def _prompt_from(record: object, where: str, bad: Report) -> SuitePrompt | None:
    """A prompt from one line's object; None (after `bad`) when a field is wrong."""
    if not isinstance(record, dict):
        bad(f'{where}: expected an object like {{"id": "...", "prompt": "..."}}')
        return None
    prompt_id = record.get("id")
    if isinstance(prompt_id, int) and not isinstance(prompt_id, bool):
        prompt_id = str(prompt_id)
    if not isinstance(prompt_id, str) or not prompt_id.strip():
        bad(f'{where}: missing "id" (a non-empty string)')
        return None
    try:
        prompt = _prompt_or_messages(record)
    except ValueError as error:
        bad(f"{where}: {error}")
        return None
    if first_surrogate(prompt_id + prompt) is not None:
        # JSON's "\udc80" decodes to a lone surrogate, which no file name, session or
        # tokenizer can take
        bad(f'{where}: "id" and "prompt" must be text without lone surrogates (\\udXXX escapes)')
        return None
    if first_surrogate(json.dumps(record, ensure_ascii=False)) is not None:
        bad(f"{where}: every text must be without lone surrogates (\\udXXX escapes)")
        return None
    try:
        max_tokens, stop = _budget_and_stops(record)
        grader = grader_from(record)
    except ValueError as error:
        bad(f"{where}: {error}")
        return None
    return SuitePrompt(prompt_id, prompt, max_tokens, where, grader, stop)


def _budget_and_stops(record: dict[str, object]) -> tuple[int | None, tuple[str, ...]]:
    """A line's "max_tokens" (through the checks every file's numbers pass: a NaN, an
    infinity or a budget beyond any run is one line naming the field) and "stop"."""
    max_tokens = record.get("max_tokens")
    if max_tokens is not None:
        max_tokens = whole_number(max_tokens, '"max_tokens"', 1, MAX_TOKENS)
    stop = record.get("stop", [])
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise BadValue('"stop" must be a list of non-empty strings')
    return max_tokens, tuple(stop)
