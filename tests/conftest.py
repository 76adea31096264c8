"""Shared fixtures. Reference data (recorded traces, AICB workloads, nccl-tests measurements) lives in
tests/reference/ inside the project, copied with its provenance notes (tests/reference/README.md), so a
fresh clone runs the whole suite; COMMPLAN_REFERENCE points elsewhere, e.g. at a larger private set."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]


def reference_dir() -> Path:
    configured = os.environ.get("COMMPLAN_REFERENCE")
    return Path(configured) if configured else ROOT / "tests" / "reference"


@pytest.fixture(scope="session")
def reference():
    """Open a file under tests/reference: ``reference("nccl/measurements.json")`` -> parsed JSON or Path."""
    base = reference_dir()
    if not base.is_dir():
        pytest.fail(f"reference data not found at {base}; set COMMPLAN_REFERENCE")

    def load(relative: str):
        path = base / relative
        return json.loads(path.read_text()) if path.suffix == ".json" else path

    return load


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answering(base: str, seconds: float = 30.0) -> bool:
    """Whether a server at ``base`` answers /healthz within ``seconds`` of its start."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return True
        except httpx.TransportError:
            time.sleep(0.2)
    return False


@pytest.fixture(scope="session")
def server():
    """The real service: `commplan serve` on a free loopback port, stopped after the session."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail(f"server did not start: {proc.stdout.read().decode()}")
    yield base
    proc.terminate()
    proc.wait(timeout=10)
