"""The fused CUDA kernels (ggmlpy.backends.cuda.kernels), checked without a GPU.

* Every CUDA C source compiles (NVRTC through CuPy's bindings when libnvrtc loads, else nvcc),
  for an explicit architecture, with no driver.
* The maths of each kernel (its NumPy emulation in tests/fake_cupy.py, which follows the CUDA
  source line by line in float32) matches float64 NumPy references written here, over a table of
  shapes: broadcasting, non-contiguous sources, odd row lengths, F16/F32 masks, ALiBi.
* Every supported node is exactly one launch.
"""

from __future__ import annotations

import math
import shutil
import subprocess

import numpy as np
import pytest
from fake_cupy import FakeCupy

from ggmlpy import ops
from ggmlpy.backends.cuda import kernels as ck
from ggmlpy.core.opcodes import GluOp, Op
from ggmlpy.core.tensor import Context, Tensor
from ggmlpy.core.types import Type

_ARCH = "compute_80"  # sm_80 (A100) and later run the PTX


def _compile_nvrtc(src: str) -> str | None:
    try:
        from cupy_backends.cuda.libs import nvrtc  # noqa: PLC0415
        prog = nvrtc.createProgram(src, "ggmlpy_kernels.cu", [], [])
    except Exception:  # noqa: BLE001 - no CuPy or no libnvrtc here
        return None
    try:
        nvrtc.compileProgram(prog, [f"-arch={_ARCH}"])
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"NVRTC rejected the kernels: {e}\n{nvrtc.getProgramLog(prog)}")
    return nvrtc.getPTX(prog).decode() if isinstance(nvrtc.getPTX(prog), bytes) else nvrtc.getPTX(prog)


def _compile_nvcc(src: str, tmp_path) -> str | None:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    f = tmp_path / "k.cu"
    f.write_text(src)
    r = subprocess.run([nvcc, f"-arch={_ARCH}", "-ptx", "-o", str(tmp_path / "k.ptx"), str(f)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return (tmp_path / "k.ptx").read_text()


def test_every_source_compiles_without_a_gpu(tmp_path):
    ptx = _compile_nvrtc(ck.ALL_SOURCE) or _compile_nvcc(ck.ALL_SOURCE, tmp_path)
    if ptx is None:
        pytest.skip("neither libnvrtc (CuPy's bindings) nor nvcc is available")
    for name in ck.SOURCES:
        assert f".entry {name}(" in ptx, name
    # each per-kernel translation unit is the shared header plus that kernel only
    for name, src in ck.SOURCES.items():
        assert src.count("__global__") == 1 and f"void {name}(" in src


# ---------------------------------------------------------------------------------------------
# maths through the fake's emulation


def _views(ctx_tensors: list[Tensor], rng) -> dict[int, np.ndarray]:
    """Host memory per root tensor, random F32/F16 data; returns {id(tensor): view}."""
    roots: dict[int, np.ndarray] = {}
    views: dict[int, np.ndarray] = {}
    for t in ctx_tensors:
        root, offs = t, 0
        while root.view_src is not None:
            offs += root.view_offs
            root = root.view_src
        if id(root) not in roots:
            n = root.nbytes
            buf = np.zeros(n + 64, np.uint8)
            if root.type == Type.F32:
                buf[:n].view(np.float32)[:] = rng.standard_normal(n // 4).astype(np.float32) * 3
            elif root.type == Type.F16:
                buf[:n].view(np.float16)[:] = rng.standard_normal(n // 2).astype(np.float16)
            roots[id(root)] = buf
        views[id(t)] = np.ndarray(t.ne[::-1], t.type.dtype, roots[id(root)], offs, t.nb[::-1])
    return views


def _run(node: Tensor, seed: int = 0) -> tuple[np.ndarray, list[np.ndarray | None]]:
    rng = np.random.default_rng(seed)
    srcs = list(node.src)
    v = _views([s for s in srcs if s is not None] + [node], rng)
    dst = v[id(node)]
    args = [None if s is None else v[id(s)] for s in srcs]
    ins = [None if a is None else a.astype(np.float64) for a in args]  # before dst is written
    fake = FakeCupy(1)
    assert ck.supports(node) and ck.kernel_name(node) in ck.SOURCES
    step = ck.make(fake, node, dst, args)
    n0, f0 = fake.launch_count(), ck.launch_count()
    step()
    assert fake.launch_count() - n0 == 1 and ck.launch_count() - f0 == 1  # one launch per node
    return dst.astype(np.float64), ins


def _gelu64(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * x * (1 + 0.044715 * x * x)))


def _gelu_erf64(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def _silu64(x):
    return x / (1 + np.exp(-x))


# float32 single-pass accumulation over <= 1000 elements: rel. error well under 1e-5
_RTOL, _ATOL = 2e-5, 2e-6

_SHAPES = [(7, 1, 1, 1), (33, 5, 1, 1), (128, 3, 2, 2), (1000, 2, 3, 1), (1, 4, 1, 1)]


@pytest.mark.parametrize("ne", _SHAPES)
@pytest.mark.parametrize("op", ["norm", "rms_norm", "l2_norm"])
def test_row_norms_match_float64(op, ne):
    ctx = Context()
    a = ctx.new_tensor(Type.F32, ne)
    eps = 1e-5 if op != "l2_norm" else 1e-6
    node = getattr(ops, op)(ctx, a, eps)
    got, (x,) = _run(node)
    if op == "norm":
        mu = x.mean(-1, keepdims=True)
        want = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
        atol = 2e-4 if ne[0] > 1 else 1e-6  # ggml-cuda's E[x^2]-mean^2: f32 cancellation
    elif op == "rms_norm":
        want = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
        atol = _ATOL
    else:
        want = x / np.maximum(np.sqrt((x * x).sum(-1, keepdims=True)), eps)
        atol = _ATOL
    np.testing.assert_allclose(got, want, rtol=_RTOL, atol=atol)


def test_row_norm_on_a_strided_row_view():
    ctx = Context()
    base = ctx.new_tensor(Type.F32, (40, 6, 2, 1))
    rows = ops.view_4d(ctx, base, 33, 3, 2, 1, base.nb[1] * 2, base.nb[2], base.nb[3], 4)
    node = ops.rms_norm(ctx, rows, 1e-6)
    got, (x,) = _run(node)
    want = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(got, want, rtol=_RTOL, atol=_ATOL)


def _alibi64(n_head: int, max_bias: float) -> np.ndarray:
    if max_bias <= 0:
        return np.ones(n_head)
    n_log2 = 2 ** int(math.floor(math.log2(n_head)))
    m0, m1 = 2.0 ** (-max_bias / n_log2), 2.0 ** (-(max_bias / 2.0) / n_log2)
    return np.array([m0 ** (h + 1) if h < n_log2 else m1 ** (2 * (h - n_log2) + 1)
                     for h in range(n_head)])


@pytest.mark.parametrize("ne, mne, mtype, scale, max_bias", [
    ((17, 3, 2, 1), None, None, 1.0, 0.0),
    ((64, 8, 4, 2), (64, 8, 1, 1), Type.F32, 0.125, 0.0),
    ((64, 5, 4, 2), (64, 9, 2, 1), Type.F16, 0.5, 0.0),
    ((40, 6, 6, 1), (40, 6, 3, 1), Type.F32, 1.0, 8.0),   # ALiBi, 6 heads (not a power of 2)
    ((1000, 2, 1, 1), (1000, 2, 1, 1), Type.F16, 2.0, 0.0),
])
def test_soft_max_matches_float64(ne, mne, mtype, scale, max_bias):
    ctx = Context()
    a = ctx.new_tensor(Type.F32, ne)
    mask = None if mne is None else ctx.new_tensor(mtype, mne)
    node = ops.soft_max_ext(ctx, a, mask, scale, max_bias)
    got, ins = _run(node, seed=3)
    x = ins[0] * scale
    if mask is not None:
        m = ins[1][:, :, :ne[1], :]
        m = m[np.arange(ne[3]) % mne[3]][:, np.arange(ne[2]) % mne[2]]
        x = x + _alibi64(ne[2], max_bias).reshape(1, -1, 1, 1) * m
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)


_UNARY = {"gelu": _gelu64, "gelu_erf": _gelu_erf64, "silu": _silu64}


@pytest.mark.parametrize("op", sorted(_UNARY))
def test_unary_matches_float64_including_a_padded_row_view(op):
    ctx = Context()
    a = ctx.new_tensor(Type.F32, (9, 13, 2, 1))
    padded = ops.view_4d(ctx, a, 7, 6, 2, 1, a.nb[1] * 2, a.nb[2], a.nb[3], 8)
    for src in (a, padded):
        node = getattr(ops, op)(ctx, src)
        got, (x,) = _run(node, seed=5)
        np.testing.assert_allclose(got, _UNARY[op](x), rtol=2e-6, atol=1e-6)


_GLU64 = {GluOp.SWIGLU: _silu64, GluOp.GEGLU: _gelu64, GluOp.GEGLU_ERF: _gelu_erf64,
          GluOp.REGLU: lambda x: np.maximum(x, 0)}


@pytest.mark.parametrize("op", sorted(_GLU64))
@pytest.mark.parametrize("swapped", [False, True])
def test_glu_fused_and_split_match_float64(op, swapped):
    ctx = Context()
    a = ctx.new_tensor(Type.F32, (2 * 37, 5, 3, 1))
    node = ops.glu(ctx, a, op, swapped)
    got, (x,) = _run(node, seed=7)
    u, g = x[..., :37], x[..., 37:]
    if swapped:
        u, g = g, u
    np.testing.assert_allclose(got, _GLU64[op](u) * g, rtol=5e-6, atol=1e-6)
    b = ctx.new_tensor(Type.F32, (37, 5, 3, 1))
    c = ctx.new_tensor(Type.F32, (37, 5, 3, 1))
    got, (u, g) = _run(ops.glu_split(ctx, b, c, op), seed=8)
    np.testing.assert_allclose(got, _GLU64[op](u) * g, rtol=5e-6, atol=1e-6)


@pytest.mark.parametrize("ne_a, ne_b", [
    ((16, 4, 3, 2), (16, 4, 3, 2)), ((16, 4, 3, 2), (16, 1, 1, 1)), ((16, 4, 3, 2), (1, 4, 1, 2)),
    ((384, 7, 1, 1), (384, 1, 1, 1)), ((6, 4, 6, 2), (3, 2, 3, 1)), ((5, 1, 1, 1), (1, 1, 1, 1)),
])
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_binary_broadcasting_matches_float64(op, ne_a, ne_b):
    ctx = Context()
    a = ctx.new_tensor(Type.F32, ne_a)
    b = ctx.new_tensor(Type.F32, ne_b)
    node = getattr(ops, op)(ctx, a, b)
    got, (x, y) = _run(node, seed=11)
    y = np.tile(y, tuple(na // nb for na, nb in zip(ne_a[::-1], ne_b[::-1])))
    want = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}[op](x, y)
    np.testing.assert_allclose(got, want, rtol=2e-7, atol=0)


def test_binary_with_a_permuted_source_and_in_place_dst():
    ctx = Context()
    a = ctx.new_tensor(Type.F32, (8, 6, 1, 1))
    b = ctx.new_tensor(Type.F32, (6, 8, 1, 1))
    node = ops.add(ctx, a, ops.transpose(ctx, b))
    got, (x, y) = _run(node, seed=2)
    np.testing.assert_allclose(got, x + y, rtol=2e-7, atol=0)


def test_supports_refuses_what_has_no_fused_kernel():
    ctx = Context()
    a16 = ctx.new_tensor(Type.F16, (8, 2, 1, 1))
    a = ctx.new_tensor(Type.F32, (8, 2, 1, 1))
    assert not ck.supports(ops.add(ctx, a16, a16))                  # F16
    assert not ck.supports(ops.unary(ctx, a, __import__("ggmlpy").UnaryOp.TANH))
    assert not ck.supports(ops.glu(ctx, a, GluOp.GEGLU_QUICK))
    assert not ck.supports(ops.norm(ctx, ops.transpose(ctx, a), 1e-5))   # rows not contiguous
    assert not ck.supports(ops.mul_mat(ctx, a, a))
    assert ck.kernel_name(ops.mul_mat(ctx, a, a)) is None
    with pytest.raises(ValueError, match="no fused kernel"):
        ck.make(FakeCupy(1), ops.mul_mat(ctx, a, a), None, [None, None])
    assert {Op.NORM, Op.RMS_NORM, Op.L2_NORM, Op.SOFT_MAX, Op.UNARY, Op.GLU, Op.ADD, Op.SUB,
            Op.MUL, Op.DIV} == set(ck.FUSED_OPS)


@pytest.mark.model
def test_minilm_on_the_fake_gpu_fused_matches_generic_in_one_launch_per_node(model_dir, monkeypatch):
    import importlib.util  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    from ggmlpy.backends.kernels import unary  # noqa: PLC0415

    monkeypatch.setattr(unary, "_erfc_fn", unary._erfc_fn)  # the bench swaps it for the fake

    path = Path(__file__).resolve().parents[3] / "scripts" / "bench_device.py"
    spec = importlib.util.spec_from_file_location("bench_device", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rep = bench.launches_report("FAKE", str(model_dir))
    assert rep["fused_vs_generic_max_abs_diff"] < 1e-5
    g, f = rep["generic"], rep["fused"]
    assert g["nodes_per_evaluation"] == f["nodes_per_evaluation"] > 100
    assert f["launches_per_node"] <= 1.3 < g["launches_per_node"]
    for op in ("NORM", "SOFT_MAX", "L2_NORM", "UNARY:GELU_ERF"):
        nodes, launches = f["by_op_nodes_launches"][op]
        assert launches == nodes > 0, op


# ---------------------------------------------------------------------------------------------
# GPU machine only: the real kernels give what their emulation gives


def _gpu_cases():
    ctx = Context()
    a = ctx.new_tensor(Type.F32, (384, 7, 3, 2))
    b = ctx.new_tensor(Type.F32, (384, 1, 3, 1))
    m16 = ctx.new_tensor(Type.F16, (384, 8, 1, 1))
    g = ctx.new_tensor(Type.F32, (2 * 384, 7, 3, 2))
    return [ops.norm(ctx, a, 1e-12), ops.rms_norm(ctx, a, 1e-6), ops.l2_norm(ctx, a, 1e-12),
            ops.soft_max_ext(ctx, a, m16, 0.125, 0.0), ops.soft_max_ext(ctx, a, m16, 1.0, 8.0),
            ops.soft_max_ext(ctx, a, None, 1.0, 0.0), ops.gelu(ctx, a), ops.gelu_erf(ctx, a),
            ops.silu(ctx, a), ops.glu(ctx, g, GluOp.SWIGLU, False), ops.glu(ctx, g, GluOp.GEGLU, True),
            ops.add(ctx, a, b), ops.mul(ctx, a, b), ops.div(ctx, a, b), ops.sub(ctx, a, b)]


@pytest.mark.gpu
@pytest.mark.parametrize("i", range(15))
def test_real_kernels_match_their_emulation(i):
    from ggmlpy.backends.cuda import runtime as cupy_runtime  # noqa: PLC0415

    cp, reason = cupy_runtime.import_cupy()
    if cp is None:
        pytest.skip(f"no CUDA device: {reason}")
    node = _gpu_cases()[i]
    want, _ = _run(node, seed=i)  # the fake's emulation, same inputs (seeded)
    rng = np.random.default_rng(i)
    srcs = [s for s in node.src if s is not None]
    host = _views(srcs + [node], rng)
    dev_bufs: dict[int, object] = {}

    def dview(t):
        root, offs = t, 0
        while root.view_src is not None:
            offs += root.view_offs
            root = root.view_src
        if id(root) not in dev_bufs:
            dev_bufs[id(root)] = cp.zeros(root.nbytes + 64, cp.uint8)
        buf = dev_bufs[id(root)]
        return cp.ndarray(t.ne[::-1], t.type.dtype, buf.data + offs, t.nb[::-1])

    for s in srcs:
        dview(s)[...] = cp.asarray(host[id(s)])
    args = [None if s is None else dview(s) for s in node.src]
    dst = dview(node)
    ck.make(cp, node, dst, args)()
    got = cp.asnumpy(dst).astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
