"""The HTML certificate renders in headless Chromium: one row per property, each with
its verdict badge, drawn on a page."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from specdiff.certify.records import (
    BATCH,
    PREFIX_CACHE,
    SPECULATION,
    Certificate,
    Compared,
    Proof,
    judge,
    not_tested,
)
from specdiff.reports.certificate import certificate_html
from tests.test_certify import run

pytestmark = pytest.mark.browser


def test_the_html_certificate_renders_in_chromium(tmp_path: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "headless Chromium is needed (apt-get install chromium)"
    shown = Proof(True, "/slots showed 4 requests running at once")
    results = [
        judge(BATCH, [Compared("prompt 1", run([1, 2, 3]), run([1, 2, 4]))], shown),
        judge(SPECULATION, [Compared("prompt 1", run([1, 2]), run([1, 2]))], shown),
        not_tested(PREFIX_CACHE, "the server exports no prefix-cache hit counter"),
    ]
    data = Certificate(
        {"kind": "server", "engine": "vllm", "endpoint": "http://127.0.0.1:8000"},
        {},
        results,
        {"wall_seconds": 1.5, "requests": 9, "tokens": 60, "tokens_per_second": 40.0},
    ).as_dict()
    page = tmp_path / "certificate.html"
    page.write_text(certificate_html(data), encoding="utf-8")
    common = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    dom = subprocess.run(
        [*common, "--dump-dom", page.resolve().as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert dom.count('class="property"') == 3
    assert 'class="verdict broken"' in dom and 'class="verdict holds"' in dom
    assert 'class="verdict not-tested"' in dom
    assert "broken: batch-invariance" in dom
    shot = tmp_path / "certificate.png"
    subprocess.run(
        [*common, "--window-size=1200,800", f"--screenshot={shot}", page.resolve().as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )
    picture = shot.read_bytes()
    assert picture[:8] == b"\x89PNG\r\n\x1a\n" and len(picture) > 10_000
