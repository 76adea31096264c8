"""Shared fixtures. Reference data lives in ../shared/reference beside the project (CI clones it there)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def reference_dir() -> Path:
    configured = os.environ.get("COMMPLAN_REFERENCE")
    return Path(configured) if configured else ROOT.parent / "shared" / "reference"


@pytest.fixture(scope="session")
def reference():
    """Open a file under shared/reference: ``reference("nccl/measurements.json")`` -> parsed JSON or Path."""
    base = reference_dir()
    if not base.is_dir():
        pytest.fail(f"reference data not found at {base}; set COMMPLAN_REFERENCE")

    def load(relative: str):
        path = base / relative
        return json.loads(path.read_text()) if path.suffix == ".json" else path

    return load
