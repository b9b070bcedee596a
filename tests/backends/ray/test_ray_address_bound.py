"""A ``GGMLPY_RAY_ADDRESS`` nobody listens on fails within ``GGMLPY_RAY_TIMEOUT_S`` (``ray.init``
alone retries for minutes) and says what was unreachable: a TCP connect checks the address
first."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ggmlpy.backends.ray.runtime import check_address_reachable
from ggmlpy.core.errors import BackendUnavailableError

ROOT = Path(__file__).resolve().parents[3]


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: a connect is refused at once
    return port


def test_refused_loopback_port_is_named():
    port = _closed_port()
    t0 = time.monotonic()
    with pytest.raises(BackendUnavailableError, match=rf"GGMLPY_RAY_ADDRESS 127\.0\.0\.1:{port} is unreachable"):
        check_address_reachable(f"127.0.0.1:{port}", 3.0)
    assert time.monotonic() - t0 < 3.0


def test_listening_port_passes_the_check():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    try:
        check_address_reachable(f"127.0.0.1:{srv.getsockname()[1]}", 3.0)  # no exception
    finally:
        srv.close()


def test_embed_with_an_unreachable_address_fails_within_the_bound():
    pytest.importorskip("ray")
    port = _closed_port()
    env = {**os.environ, "GGMLPY_RAY_ADDRESS": f"127.0.0.1:{port}", "GGMLPY_RAY_TIMEOUT_S": "3",
           "GGMLPY_RAY_DEVICES": "1"}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "ggmlpy", "embed", "--device", "RAY0", "x"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - t0
    assert r.returncode == 2, r.stderr
    assert f"127.0.0.1:{port} is unreachable" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert elapsed < 30  # interpreter + imports + the refused connect; ray.init alone: minutes
