"""CuPy compatibility of the kernels and the CUDA runtime, checked without a GPU.

* Every test-backend-ops case is compiled (``kernels.compile_node``) over **real** ``cupy.ndarray``
  views of a made-up device address, on a machine where CuPy imports but has no driver: building
  views (``as_strided``, slicing, reshapes of contiguous arrays, flags) is metadata-only in CuPy,
  while anything that touches the device (a copy, a kernel launch, a host<->device transfer other
  than the constants uploaded on purpose) raises. So a kernel that snapshots data at compile time,
  or calls a NumPy-only API on a CuPy array while building its plan, fails here.
* The CuPy-only code paths (``dot`` for single GEMMs, float64 ``erfc`` GELU) run over the NumPy
  stand-in of ``tests/fake_cupy.py`` and must give the NumPy results.
* ``CupyRuntime.launch`` maps CuPy's driver/library errors and pool OOM to ggmlpy's errors.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from fake_cupy import FakeCupy

from ggmlpy.backends import kernels
from ggmlpy.backends.cuda import runtime as cupy_runtime
from ggmlpy.backends.kernels import common, matmul, unary
from ggmlpy.core import special
from ggmlpy.core.errors import ComputeError, OutOfMemoryError
from ggmlpy.core.graph import Graph
from ggmlpy.core.opcodes import VIEW_OPS, Op
from ggmlpy.core.types import Type


def _cupy_without_device():
    try:
        import cupy  # noqa: PLC0415
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"CuPy not importable: {e}")
    if cupy_runtime.import_cupy()[0] is not None:
        # with a real device the made-up addresses below would be dereferenced
        pytest.skip("a CUDA device is present: the GPU tests cover the kernels there")
    return cupy


_BASE = 0x7F00_0000_0000  # a made-up device address; every tensor gets its own 1 GiB window
_WINDOW = 1 << 30


def _case_ids():
    from ggmlpy.testops.families import all_cases  # noqa: PLC0415

    return all_cases()


def test_every_case_compiles_over_real_cupy_views_without_device_work(monkeypatch):
    cp = _cupy_without_device()
    mem = cp.cuda.UnownedMemory(_BASE, 1 << 46, None, 0)

    def view(shape, dtype, strides, slot, offset=0):
        ptr = cp.cuda.MemoryPointer(mem, slot * _WINDOW + offset)
        return cp.ndarray(tuple(shape), dtype, ptr, tuple(strides))

    n_consts = [0]

    def const(obj, dtype=None):  # compile-time constants: the only upload kernels may do
        a = np.asarray(obj, dtype=dtype)
        n_consts[0] += 1
        return view(a.shape, a.dtype, list(np.empty_like(a, order="C").strides),
                    10_000 + n_consts[0])

    monkeypatch.setattr(cp, "asarray", const)
    monkeypatch.setattr(cp, "arange", lambda *a, **k: const(np.arange(*a, **k)))

    compiled = 0
    for case in _case_ids():
        ctx, _b, out = case.build_graph()
        g = Graph()
        g.build_forward_expand(out)
        slots: dict[int, int] = {}

        def arr(t):
            root, offs = t, 0
            while root.view_src is not None:
                offs += root.view_offs
                root = root.view_src
            slot = slots.setdefault(id(root), len(slots))
            if t.type.is_quantized:  # raw rows, as cupy_runtime.array gives them
                row = t.type.row_size(t.ne[0])
                return view((t.ne[3], t.ne[2], t.ne[1], row), np.uint8,
                            (t.nb[3], t.nb[2], t.nb[1], 1), slot, offs)
            dt = np.uint16 if t.type == Type.BF16 else t.type.dtype
            return view(t.ne[::-1], dt, t.nb[::-1], slot, offs)

        for node in g.nodes:
            if node.op == Op.NONE or node.op in VIEW_OPS or node.is_empty():
                continue
            if not kernels.supports_op(node, cp):
                continue
            srcs = [None if s is None else arr(s) for s in node.src]
            try:
                kernels.compile_node(cp, node, arr(node), srcs)
            except Exception as e:  # noqa: BLE001
                pytest.fail(f"{case.name}: node {node.op.name} '{node.name}' does device work or "
                            f"uses a non-CuPy API at compile time: {type(e).__name__}: {e}")
            compiled += 1
    assert compiled > 100


def test_single_gemm_uses_dot_on_cupy_and_matches_numpy():
    fake = FakeCupy(1)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((1, 1, 5, 7)).astype(np.float32)   # ne [7, 5]: M=5, K=7
    b = rng.standard_normal((1, 3, 4, 7)).astype(np.float32)   # broadcast over dim 2 (r2=3)
    d = np.empty((1, 3, 4, 5), np.float32)
    step = matmul._matmul_step(fake, a, b, d)
    assert getattr(step, "func", None) is np.dot  # fake.dot is np.dot: the 2-D dot path
    step()
    np.testing.assert_allclose(d, b @ a.swapaxes(-1, -2), rtol=1e-5, atol=1e-6)
    # a non-contiguous destination keeps matmul (dot requires a C-contiguous out)
    dd = np.empty((1, 3, 5, 4), np.float32).swapaxes(-1, -2)
    step2 = matmul._matmul_step(fake, a, b, dd)
    assert getattr(step2, "func", None) is np.matmul
    step2()
    np.testing.assert_allclose(dd, b @ a.swapaxes(-1, -2), rtol=1e-5, atol=1e-6)


def test_gelu_erf_cupy_path_matches_numpy_to_the_ulp(monkeypatch):
    monkeypatch.setattr(unary, "_erfc_fn", lambda xp: special.erfc)  # the fake has no cupyx
    x = np.concatenate([np.linspace(-12, 12, 4001), [-5.9, -8.0, 0.0, 1e-30, np.inf]]).astype(np.float32)
    got = unary._gelu_erf(FakeCupy(1), x)
    want = unary._gelu_erf(np, x)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    assert got[np.searchsorted(x[:4001], -5.9)] != 0.0  # no f32 cancellation of 1 + erf
    assert math.isclose(float(got[-5]), 0.5 * -5.9 * math.erfc(5.9 / math.sqrt(2)), rel_tol=1e-6)


def test_inplace_ufunc_inputs_are_the_output_object():
    base = np.zeros((4, 6), np.float32)
    d = base[:, :4]
    a = base[:, :4]            # another view of exactly the same memory
    b = np.ones((4, 4), np.float32)
    step = common.ufunc_step(FakeCupy(1), np.add, a, b, out=d)
    assert step.args[0] is d and step.args[1] is b and step.keywords["out"] is d
    assert common.alias(np.float32(2), d) is not d


def test_argsort_is_stable_on_every_backend():
    from ggmlpy import Context, Type  # noqa: PLC0415
    from ggmlpy.ops import argsort  # noqa: PLC0415

    ctx = Context()
    a = ctx.new_tensor_1d(Type.F32, 40)
    node = argsort(ctx, a, 1)  # descending
    x = np.zeros((1, 1, 1, 40), np.float32)
    x[..., ::3] = 1.0
    dst = np.empty((1, 1, 1, 40), np.int32)
    kernels.compile_node(np, node, dst, [x])()
    ones = np.flatnonzero(x[0, 0, 0] == 1.0)
    zeros = np.flatnonzero(x[0, 0, 0] == 0.0)
    np.testing.assert_array_equal(dst[0, 0, 0], np.concatenate([ones, zeros]))


class _DriverError(Exception):
    pass


_DriverError.__module__ = "cupy_backends.cuda.api.driver"


def test_launch_maps_driver_errors_and_pool_oom():
    rt = cupy_runtime.CupyRuntime(FakeCupy(1))
    s = rt.stream_new(0, "t")

    def driver_fault():
        raise _DriverError("CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access")

    with pytest.raises(ComputeError, match="ILLEGAL_ADDRESS"):
        rt.launch(s, driver_fault)

    class PoolOOM(MemoryError):
        def __init__(self):
            super().__init__("Out of memory allocating 1,024 bytes")
            self._size = 1024

    def oom():
        raise PoolOOM()

    with pytest.raises(OutOfMemoryError) as info:
        rt.launch(s, oom)
    assert info.value.requested == 1024

    def bug():
        raise KeyError("not a CUDA error")

    with pytest.raises(KeyError):
        rt.launch(s, bug)
    rt.stream_free(s)
