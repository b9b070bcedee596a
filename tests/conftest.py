"""Shared pytest fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """The reference-fixture folder: ``$GGMLPY_FIXTURES``, else ``<repo>/../shared/fixtures``.

    Skips the requesting test when the folder does not exist.
    """
    path = Path(os.environ.get("GGMLPY_FIXTURES") or REPO_ROOT.parent / "shared" / "fixtures")
    if not path.is_dir():
        pytest.skip(f"fixtures folder {path} not found (set GGMLPY_FIXTURES)")
    return path
