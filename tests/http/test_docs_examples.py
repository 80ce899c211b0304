"""HC-1..HC-5: the examples of docs/http-clients.md run as written against the test
project's stand-in upstream (only its port differs from the page's 8765)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from testproject import upstream as upstream_module

PAGE = Path(__file__).resolve().parents[2] / "docs" / "http-clients.md"
BLOCKS = re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S)


@pytest.fixture
def upstream():
    server = upstream_module.start_in_thread()
    yield server
    server.stop()


def test_the_page_has_examples():
    """HC-1..HC-5: the page shows requests, httpx sync and async, and the health endpoint."""
    text = "\n".join(BLOCKS)
    for name in ("BreakerAdapter", "BreakerTransport", "AsyncBreakerTransport", "health_view", "BreakerHealthCheck"):
        assert name in text


@pytest.mark.django_db
@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=[f"block{i + 1}" for i in range(len(BLOCKS))])
def test_hc_docs_example_runs_as_written(fresh_registry, upstream, index):
    """HC-1..HC-5: each ```python block of docs/http-clients.md runs without error against a
    real local server, and what it prints is what its comments say."""
    port = upstream.server_address[1]
    code = BLOCKS[index].replace("127.0.0.1:8765", f"127.0.0.1:{port}")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, f"{PAGE.name} block {index + 1}", "exec"), {"__name__": "__docs__"})
    printed = out.getvalue()
    for line in BLOCKS[index].splitlines():
        match = re.search(r"print\(.*\)\s+# (.+)$", line)
        if match:  # "# 200 succeeded (or ...)": the words before any "(" or "," were printed
            expected = re.split(r"[(,]", match.group(1))[0].strip()
            assert expected in printed, (match.group(1), printed)
