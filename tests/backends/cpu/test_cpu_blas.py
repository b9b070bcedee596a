"""The external CBLAS behind the CPU's float32 GEMMs (``ggmlpy.backends.cpu.blas``,
``GGMLPY_BLAS``): every layout a MUL_MAT or OUT_PROD can hand it, against float64 NumPy.

Two libraries are exercised: MKL (the ``mkl`` extra; skipped with a reason when not installed)
and the OpenBLAS bundled with NumPy's wheel, loaded by path through the same ctypes layer (so the
layer is tested even without MKL).
"""

from __future__ import annotations

import numpy as np
import pytest

from ggmlpy import ops
from ggmlpy.alloc.tallocr import alloc_ctx_tensors
from ggmlpy.backend.interface import BufferUsage
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set
from ggmlpy.backends.cpu import blas as cpu_blas
from ggmlpy.backends.cpu.backend import backend_cpu_init
from ggmlpy.backends.kernels import matmul
from ggmlpy.core.env import EnvError, blas
from ggmlpy.core.errors import BackendUnavailableError
from ggmlpy.core.graph import Graph
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type


def _mkl():
    try:
        return cpu_blas.load_mkl()
    except BackendUnavailableError as e:
        pytest.skip(f"MKL not installed (the mkl extra): {e}")


def _openblas():
    path = cpu_blas.numpy_openblas_path()
    if path is None:
        pytest.skip("this NumPy bundles no OpenBLAS (built against a system BLAS)")
    return cpu_blas.load(path)


LIBS = {"mkl": _mkl, "numpy-openblas": _openblas}


def _matrix(rng, batch, rows, cols, transposed, pad):
    """A float32 ``batch + (rows, cols)`` view: row-major or column-major (``transposed``), with
    ``pad`` unused elements per leading-dimension step."""
    if transposed:
        base = rng.standard_normal(batch + (cols, rows + pad), dtype=np.float32)
        return base[..., :rows].swapaxes(-1, -2)
    base = rng.standard_normal(batch + (rows, cols + pad), dtype=np.float32)
    return base[..., :cols]


@pytest.mark.parametrize("lib", list(LIBS))
def test_every_layout_matches_float64(lib):
    """Random batch shapes, sizes (1 included: its stride is free), row- or column-major operands
    and outputs, padded leading dimensions; the output starts as NaN (``beta = 0`` never reads
    it). MKL takes every case; NumPy's OpenBLAS (no batched call) takes exactly the unbatched
    ones."""
    cb = LIBS[lib]()
    rng = np.random.default_rng(7)
    taken = 0
    for _ in range(400):
        batch = tuple(int(n) for n in rng.integers(1, 4, int(rng.integers(0, 3))))
        N, K, M = (int(n) for n in rng.integers(1, 10, 3))
        bv = _matrix(rng, batch, N, K, bool(rng.integers(2)), int(rng.integers(3)))
        aT = _matrix(rng, batch, K, M, bool(rng.integers(2)), int(rng.integers(3)))
        dv = _matrix(rng, batch, N, M, bool(rng.integers(2)), int(rng.integers(3)))
        dv[...] = np.nan
        step = cb.gemm_step(bv, aT, dv)
        n_mat = int(np.prod(batch)) if batch else 1
        assert (step is not None) == (n_mat == 1 or cb.batched), (batch, N, K, M)
        if step is None:
            continue
        step()
        taken += 1
        ref = np.matmul(bv.astype(np.float64), aT.astype(np.float64))
        np.testing.assert_allclose(dv, ref, rtol=1e-5, atol=1e-5 * K,  # float32 sums of K terms
                                   err_msg=f"{lib} {batch} N={N} K={K} M={M}")
    assert taken >= 100


@pytest.mark.parametrize("lib", list(LIBS))
def test_products_it_cannot_take_stay_on_numpy(lib):
    """None (NumPy's matmul) for: an output overlapping an operand, a non-float32 operand, a zero
    dimension, an operand with no unit stride, a read-only output, mismatched shapes."""
    cb = LIBS[lib]()
    x = np.ones((4, 4), np.float32)
    buf = np.ones((4, 8), np.float32)
    assert cb.gemm_step(buf[:, :4], x, buf[:, 4:]) is not None  # disjoint halves of one array
    assert cb.gemm_step(buf[:, :4], x, buf[:, 2:6]) is None      # overlapping
    assert cb.gemm_step(x.astype(np.float64), x, np.empty((4, 4), np.float32)) is None
    assert cb.gemm_step(np.ones((4, 0), np.float32), np.ones((0, 4), np.float32),
                        np.empty((4, 4), np.float32)) is None
    strided = np.ones((8, 8), np.float32)[::2, ::2]
    assert cb.gemm_step(strided, x, np.empty((4, 4), np.float32)) is None
    ro = np.empty((4, 4), np.float32)
    ro.flags.writeable = False
    assert cb.gemm_step(x, x, ro) is None
    assert cb.gemm_step(x, np.ones((4, 3), np.float32), np.empty((4, 4), np.float32)) is None
    xb = np.ones((3, 4, 4), np.float32)
    assert cb.gemm_step(xb, xb, np.lib.stride_tricks.as_strided(
        np.empty((4, 4), np.float32), (3, 4, 4), (0, 16, 4))) is None  # 3 products, 1 matrix


def _mul_mat_graph(n_threads, weight_t=Type.F32, f16_values=False):
    """MUL_MAT of a (K=96, M=80) weight by (K, N=70) activations on the CPU backend; returns
    (result, float64 reference). ``f16_values``: the weight's values are rounded to float16
    first (as an F16 weight holds them) whatever ``weight_t``."""
    rng = np.random.default_rng(3)
    K, M, N = 96, 80, 70
    wctx, ctx = Context(no_alloc=True), Context(no_alloc=True)
    w = wctx.new_tensor(weight_t, (K, M))
    x = ctx.new_tensor(Type.F32, (K, N))
    y = ops.mul_mat(ctx, w, x)
    cpu = backend_cpu_init()
    cpu.set_n_threads(n_threads)
    wbuf = alloc_ctx_tensors(wctx, cpu)
    wbuf.set_usage(BufferUsage.WEIGHTS)  # F16: the weight cache keeps its float32 copy
    buf = alloc_ctx_tensors(ctx, cpu)
    try:
        W = rng.standard_normal((M, K)).astype(np.float32)
        if f16_values or weight_t == Type.F16:
            W = W.astype(np.float16).astype(np.float32)
        X = rng.standard_normal((N, K)).astype(np.float32)
        backend_tensor_set(w, W if weight_t == Type.F32 else W.astype(np.float16))
        backend_tensor_set(x, X)
        g = Graph(8)
        g.build_forward_expand(y)
        cpu.graph_compute(g)
        cpu.graph_compute(g)  # the second call is served by the weight cache (F16)
        got = np.asarray(backend_tensor_get(y)).reshape(-1).view(np.float32).reshape(N, M)
        return got.copy(), X.astype(np.float64) @ W.astype(np.float64).T
    finally:
        buf.free()
        wbuf.free()
        cpu.free()


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("choice", ["numpy", "mkl", "numpy-openblas"])
def test_mul_mat_graph_under_each_choice(choice, n_threads, monkeypatch):
    """A MUL_MAT graph (whole, and split by rows over 2 threads) under each ``GGMLPY_BLAS``."""
    if choice == "mkl":
        _mkl()
        monkeypatch.setenv("GGMLPY_BLAS", "mkl")
    elif choice == "numpy-openblas":
        monkeypatch.setenv("GGMLPY_BLAS", _openblas().path)
    else:
        monkeypatch.setenv("GGMLPY_BLAS", "numpy")
    used = []
    real = cpu_blas.CBlas.gemm_call
    monkeypatch.setattr(cpu_blas.CBlas, "gemm_call",
                        lambda self, *a: (used.append(self.name), real(self, *a))[1])
    got, ref = _mul_mat_graph(n_threads)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * 96)  # float32 sums of 96 terms
    assert bool(used) == (choice != "numpy")


def test_weight_cache_path_uses_the_same_library(monkeypatch):
    """An F16 weight's cached float32 copy goes to the same library as an F32 weight: the result
    equals the F32 product of the converted values bit for bit. (``dequant``: the float32
    activations as they are; under ``ggml`` numerics they are first rounded to F16.)"""
    _mkl()
    monkeypatch.setenv("GGMLPY_BLAS", "mkl")
    monkeypatch.setenv("GGMLPY_QUANT_MATMUL", "dequant")
    used = []
    real = cpu_blas.CBlas.gemm_call
    monkeypatch.setattr(cpu_blas.CBlas, "gemm_call",
                        lambda self, *a: (used.append(a[1].base is not None), real(self, *a))[1])
    hits = matmul.CACHE.stats()["hits"]
    got16, ref = _mul_mat_graph(1, Type.F16)
    assert matmul.CACHE.stats()["hits"] > hits and used  # the copy served, through MKL
    got32, _ = _mul_mat_graph(1, Type.F32, f16_values=True)
    np.testing.assert_allclose(got16, ref, rtol=1e-5, atol=1e-5 * 96)
    np.testing.assert_array_equal(got16, got32)


def test_env_parsing(monkeypatch, tmp_path):
    monkeypatch.delenv("GGMLPY_BLAS", raising=False)
    assert blas() == "auto"
    for v, want in (("MKL", "mkl"), (" numpy ", "numpy"), ("Auto", "auto")):
        monkeypatch.setenv("GGMLPY_BLAS", v)
        assert blas() == want
    monkeypatch.setenv("GGMLPY_BLAS", "openblass")
    with pytest.raises(EnvError, match="GGMLPY_BLAS='openblass'"):
        blas()
    not_a_lib = tmp_path / "libnot.so"
    not_a_lib.write_text("text")
    monkeypatch.setenv("GGMLPY_BLAS", str(not_a_lib))
    assert blas() == str(not_a_lib)
    with pytest.raises(BackendUnavailableError, match="cannot load the CBLAS library"):
        cpu_blas.active()
    with pytest.raises(EnvError, match="GGMLPY_BLAS=.*loadable CBLAS library"):
        cpu_blas.active()  # the same error is an environment error too (the CLI: exit 2)
    assert cpu_blas.describe().startswith("unavailable (cannot load")
    monkeypatch.setenv("GGMLPY_BLAS", str(tmp_path))
    with pytest.raises(EnvError, match="a folder, not a file"):
        blas()
    monkeypatch.setenv("GGMLPY_BLAS", "numpy")
    assert cpu_blas.active() is None and cpu_blas.describe() == "numpy"


def test_auto_is_mkl_when_installed(monkeypatch):
    _mkl()
    monkeypatch.delenv("GGMLPY_BLAS", raising=False)
    assert cpu_blas.active().name == "mkl"
    assert cpu_blas.describe().startswith("mkl ")


def test_mkl_under_another_name_is_still_mkl(monkeypatch, tmp_path):
    """A symbolic link to libmkl_rt with another name, in another folder: opened by its real
    path (MKL finds its parts beside it) and set up as MKL (sequential, LP64, batched)."""
    mkl = _mkl()
    link = tmp_path / "libcblas.so"
    link.symlink_to(mkl.path)
    lib = cpu_blas.load(str(link))
    assert lib.name == "mkl" and lib.batched and lib.version == mkl.version
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = np.full((3, 3), np.nan, np.float32)
    lib.gemm_step(x, x.T, out)()
    np.testing.assert_array_equal(out, x.astype(np.float64) @ x.T.astype(np.float64))


@pytest.mark.parametrize("kind", ["not a library", "mkl missing"])
def test_cli_exits_2_on_a_library_that_cannot_load(kind, monkeypatch, tmp_path, capsys):
    """``GGMLPY_BLAS`` naming a library that does not load is a bad environment variable: every
    command exits 2 with one line naming it, before doing anything (``devices`` included)."""
    from ggmlpy.cli import main

    if kind == "mkl missing":
        value, why = "mkl", "MKL is not available"
        monkeypatch.setattr(cpu_blas, "_mkl_candidates", list)
        monkeypatch.setattr(cpu_blas, "_loaded", {})
    else:
        bad = tmp_path / "libtext.so"
        bad.write_text("text")
        value, why = str(bad), "cannot load the CBLAS library"
    monkeypatch.setenv("GGMLPY_BLAS", value)
    assert main(["devices"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "GGMLPY_BLAS=" in err[0] and why in err[0]


def test_cpu_backend_creation_reports_an_unloadable_library(monkeypatch, tmp_path):
    bad = tmp_path / "libbad.so"
    bad.write_text("not a library")
    monkeypatch.setenv("GGMLPY_BLAS", str(bad))
    with pytest.raises(cpu_blas.BlasUnavailableError, match="cannot load"):
        backend_cpu_init()
