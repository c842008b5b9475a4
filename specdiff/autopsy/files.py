"""An autopsy saved beside its session (`specdiff explain SESSION --save`), where a
replay finds it without loading the model, and the model files a re-run needs.
"""

from __future__ import annotations

import json
from pathlib import Path

from specdiff.autopsy.findings import Autopsy
from specdiff.autopsy.records import AutopsyError
from specdiff.files import write_text_atomic
from specdiff.lanes import Pair
from specdiff.safe_text import visible

SAVED_SUFFIX = ".autopsy.json"
MAX_SAVED_BYTES = 16 * 1024 * 1024


def missing_model(pair: Pair) -> tuple[str, Path] | None:
    """The first in-process lane whose own model file is gone, and that file's path:
    the autopsy re-runs both lanes, which a missing file makes impossible."""
    for lane_id, lane in (("a", pair.a), ("b", pair.b)):
        if lane.backend == "local" and lane.model != "default":
            path = Path(lane.model).expanduser()
            if not path.is_file():
                return lane_id, path
    return None


def saved_beside(session_path: Path) -> Path:
    """Where `specdiff explain SESSION --save` writes the autopsy, and where a replay of
    that session looks for it: run-1.jsonl's is run-1.autopsy.json."""
    return session_path.with_name(session_path.stem + SAVED_SUFFIX)


def save_beside(session_path: Path, autopsy: Autopsy) -> Path:
    """Write the record beside its session (atomically: a replay may be reading it)."""
    target = saved_beside(session_path)
    text = json.dumps(autopsy.to_json(), indent=1, ensure_ascii=True, allow_nan=False)
    write_text_atomic(target, text + "\n")
    return target


def load_saved(path: Path) -> Autopsy:
    """A saved record, checked field by field; anything else is one AutopsyError line
    naming the file."""
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_SAVED_BYTES + 1)
    except OSError as error:
        raise AutopsyError(f"{visible(path.name)}: cannot read it ({error.strerror})") from None
    if len(raw) > MAX_SAVED_BYTES:
        raise AutopsyError(f"{visible(path.name)}: over {MAX_SAVED_BYTES} bytes; not an autopsy")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise AutopsyError(
            f"{visible(path.name)}: not JSON; write it again with specdiff explain --save"
        ) from None
    return Autopsy.from_json(data, where=visible(path.name))
