"""An exported session as JSON (`specdiff-export`, version 1): the session's header and
summary, the fork and its class at the report's near-tie threshold, and each lane's
text, token ids and margins.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from specdiff import __version__
from specdiff.chat import Conversation
from specdiff.compare import DEFAULT_SPLIT_THRESHOLD
from specdiff.json_numbers import finite_everywhere
from specdiff.lanes import differences
from specdiff.reports.export_content import (
    LANE_IDS,
    SessionReport,
    document_title,
    lane_description,
    verdict,
)
from specdiff.reports.text import fork_json
from specdiff.safe_text import json_text
from specdiff.sessions.records import MEASURED_FIELDS
from specdiff.steps import text_of

EXPORT_SCHEMA = "specdiff-export"


EXPORT_VERSION = 1


def json_document(report: SessionReport) -> str:
    session = report.session
    header = session.header.to_json()
    document = {
        "schema": EXPORT_SCHEMA,
        "version": EXPORT_VERSION,
        "exported_by": {"specdiff": __version__},
        "source": {
            "file": session.path.name,
            "session_schema": header["schema"],
            "written_by": header["specdiff"],
        },
        "title": document_title(session),
        "partial": session.partial,
        "cut": session.cut_note,
        "cancelled": session.footer is not None and session.footer.cancelled,
        "verdict": verdict(session, report.comparison),
        "pair": header["pair"],
        "description": header["description"],
        "created": header["created"],
        "prompt": session.prompt,
        **(
            {"messages": session.prompt.to_json()}
            if isinstance(session.prompt, Conversation)
            else {}
        ),
        "prompt_token_ids": header["prompt_token_ids"],
        **({"lane_prompts": header["lane_prompts"]} if "lane_prompts" in header else {}),
        "max_tokens": header["max_tokens"],
        "stop": header["stop"],
        "config": {
            "lanes": header["lanes"],
            "lanes_differ_in": differences(session.pair.a, session.pair.b),
            "executed": header["executed"],
            "build": header["build"],
        },
        "summary": _json_summary(report),
        "lanes": {lane_id: _json_lane(report, lane_id) for lane_id in LANE_IDS},
        **({} if report.autopsy is None else {"autopsy": report.autopsy.to_json()}),
    }
    text = json.dumps(finite_everywhere(document), indent=2, ensure_ascii=False, allow_nan=False)
    return json_text(text) + "\n"


def _json_summary(report: SessionReport) -> dict[str, Any]:
    comparison, fork = report.comparison, report.fork
    after = comparison.after_fork
    summary = report.session.summary().to_json()
    del summary["type"]
    # the class below is read at this report's threshold, not the run's recorded one
    summary.pop("near_tie", None)
    if report.session.partial:
        # no footer: what only the run itself measured is unknown
        summary.update({key: [None, None] for key in MEASURED_FIELDS})
    verdict = report.verdict
    return summary | {
        # the class at this report's near-tie threshold (the footer's used the run's)
        "fork_class": None if verdict is None else verdict.kind,
        "fork_reference_lane": None if verdict is None else verdict.reference,
        "split_threshold": DEFAULT_SPLIT_THRESHOLD,
        "fork": fork_json(fork),
        "why": report.why,
        "near_tie_threshold": comparison.near_tie_threshold,
        "near_ties": {"a": list(comparison.near_ties_a), "b": list(comparison.near_ties_b)},
        "near_ties_are_before_fork": fork is not None,
        "similarity_after_fork": None if after is None else after.similarity,
    }


def _json_lane(report: SessionReport, lane_id: str) -> dict[str, Any]:
    steps = report.steps(lane_id)
    executed = report.session.header.executed
    return {
        "description": lane_description(report.session, lane_id),
        "tokens": len(steps),
        "tokens_per_second": report.footer_value("tokens_per_second", lane_id),
        "stop_reason": report.footer_value("stop_reasons", lane_id),
        "error": report.footer_value("errors", lane_id),
        "output_sha256": report.footer_value("output_sha256", lane_id),
        "recorded_sha256": hashlib.sha256(b"".join(s.piece for s in steps)).hexdigest(),
        "model_sha256": executed[lane_id].get("model_sha256"),
        "text": text_of(steps),
        "token_ids": [step.token_id for step in steps],
        "margins": [round(step.margin, 5) for step in steps],
        "rescored_steps": [step.index for step in steps if step.source],
    }
