"""Fused CUDA kernels for the CuPy backend: one launch per node for the ops that dominate
transformer inference (NORM, RMS_NORM, L2_NORM, SOFT_MAX with mask/scale/ALiBi, GELU, GELU_ERF,
SILU, the GLUs SWIGLU/GEGLU/GEGLU_ERF/REGLU, and ADD/SUB/MUL/DIV with ggml's broadcasting).

The generic kernels (:mod:`ggmlpy.backends.kernels`) express each op as several CuPy calls (NORM
was 13 launches, SOFT_MAX with a mask 7); here every supported node is exactly **one**
launch of a kernel of one ``cupy.RawModule``. Sums are accumulated in float32, as ggml-cuda does (``norm_f32``,
``rms_norm_f32``, ``l2_norm_f32``, ``soft_max_f32`` use float accumulators and warp shuffles), so
nothing runs in float64 on the device.

Contract, the same as the kernels registry's: ``make(xp, node, dst, srcs) -> step`` where ``dst``
and ``srcs[i]`` are 4-D ``xp`` views (NumPy shape ``ne[::-1]``, byte strides ``nb[::-1]``) and
``step()`` enqueues the kernel on the current stream.
All kernels are compiled together (one ``cupy.RawModule``, one NVRTC run) on first use. :func:`supports` says, per node, whether
the fused kernel applies (F32 tensors; row kernels also need ``nb[0] == 4`` on their rows); when
it does not, the generic kernel must be used.

Registration: :func:`register` stacks :func:`make` in front of the generic kernel of every op in
:data:`FUSED_OPS` (``KernelRegistry.override``) with the predicate
``is_cuda(xp) and supports(node)``; the kernels package calls it on import, so CUDA plans
use the fused kernel wherever it applies and CPU/SIM plans never see it.

Every source is in :data:`SOURCES` (CUDA C, ``extern "C"`` names) so CI compiles them without a
GPU (``tests/test_cuda_kernels.py``: nvcc, or NVRTC from the ctk wheels). ``tests/fake_cupy.py``
emulates each kernel name with NumPy float32 code of the same maths.

Launch counting: :func:`launch_count` is the number of fused launches issued in this process (all
streams, all devices); ``CupyRuntime.launch_count`` adds it to what the array module reports.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from ggmlpy.core.opcodes import GluOp, Op, UnaryOp
from ggmlpy.core.tensor import Tensor
from ggmlpy.core.types import Type

__all__ = ["SOURCES", "ALL_SOURCE", "FUSED_OPS", "supports", "make", "launch_count", "kernel_name",
           "is_cuda", "supports_on", "register"]

Step = Callable[[], None]

_BLOCK_EW = 256
_MAX_GRID_EW = 65535 * 8

# ---------------------------------------------------------------------------------------------
# CUDA C sources

_HEADER = r"""
typedef long long i64;
__device__ __forceinline__ float ld_f16(const char* p) {
    unsigned short h = *(const unsigned short*)p;
    unsigned int s = (h >> 15) & 1u, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    float v;
    if (e == 0u) v = ldexpf((float)m, -24);
    else if (e == 31u) v = m ? __int_as_float(0x7fc00000) : __int_as_float(0x7f800000);
    else v = ldexpf((float)(m | 0x400u), (int)e - 25);
    return s ? -v : v;
}
"""


def _reductions(*ops: tuple[str, str, str]) -> str:
    """CUDA C ``warp_<name>`` (xor-shuffle butterfly over the 32 lanes) and ``block_<name>``
    (per-warp results through 32 floats of shared memory ``sh``) for each ``(name, step,
    identity)``: ``step`` folds ``s`` (the partner lane's value) into ``v``; ``identity`` fills
    the lanes past the block's warps."""
    shfl = "__shfl_xor_sync(0xffffffffu, v, o)"
    warp = "".join(
        f"__device__ __forceinline__ float warp_{name}(float v) {{\n"
        f"    for (int o = 16; o > 0; o >>= 1) {step.format(s=shfl)};\n"
        "    return v;\n"
        "}\n" for name, step, _ in ops)
    block = "".join(
        f"__device__ float block_{name}(float v, float* sh) {{\n"
        "    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;\n"
        f"    v = warp_{name}(v);\n"
        "    if (lane == 0) sh[w] = v;\n"
        "    __syncthreads();\n"
        f"    v = lane < nw ? sh[lane] : {identity};\n"
        f"    v = warp_{name}(v);\n"
        "    __syncthreads();\n"
        "    return v;\n"
        "}\n" for name, _, identity in ops)
    return (warp + "/* block-wide reductions; blockDim.x is a multiple of 32 and at most 1024; sh "
            "has 32 floats */\n" + block)


_HEADER += _reductions(("sum", "v += {s}", "0.0f"),
                       ("max", "v = fmaxf(v, {s})", "__int_as_float(0xff800000)"))

#: element-wise expressions over x (src0 or the GLU's value half), y (src1 / the gate), float32
_EW_EXPR: dict[str, str] = {
    "add": "x + y",
    "sub": "x - y",
    "mul": "x * y",
    "div": "x / y",
    "gelu": "0.5f*x*(1.0f + tanhf(0.7978845608028654f*x*(1.0f + 0.044715f*x*x)))",
    "gelu_erf": "0.5f*x*(1.0f + erff(x*0.7071067811865476f))",
    "silu": "x/(1.0f + expf(-x))",
    "swiglu": "x/(1.0f + expf(-x))*y",
    "geglu": "0.5f*x*(1.0f + tanhf(0.7978845608028654f*x*(1.0f + 0.044715f*x*x)))*y",
    "geglu_erf": "0.5f*x*(1.0f + erff(x*0.7071067811865476f))*y",
    "reglu": "fmaxf(x, 0.0f)*y",
}
_EW_UNARY = frozenset({"gelu", "gelu_erf", "silu"})

_EW_TEMPLATE = r"""
extern "C" __global__ void ggmlpy_ew_NAME(
        const char* a, const char* b, char* d, const i64 n,
        const i64 ne0, const i64 ne1, const i64 ne2,
        const i64 a0, const i64 a1, const i64 a2, const i64 a3,
        const i64 bn0, const i64 bn1, const i64 bn2, const i64 bn3,
        const i64 b0, const i64 b1, const i64 b2, const i64 b3,
        const i64 d0, const i64 d1, const i64 d2, const i64 d3) {
    for (i64 i = (i64)blockIdx.x*blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x*blockDim.x) {
        const i64 i0 = i % ne0; i64 r = i / ne0;
        const i64 i1 = r % ne1; r /= ne1;
        const i64 i2 = r % ne2; const i64 i3 = r / ne2;
        const float x = *(const float*)(a + i0*a0 + i1*a1 + i2*a2 + i3*a3);
        const float y = READ_Y; (void)y;
        *(float*)(d + i0*d0 + i1*d1 + i2*d2 + i3*d3) = EXPR;
    }
}
"""
_READ_Y = "*(const float*)(b + (i0 % bn0)*b0 + (i1 % bn1)*b1 + (i2 % bn2)*b2 + (i3 % bn3)*b3)"

#: the start of a one-block-per-row kernel's body: ``sh`` (32 floats for block_sum/block_max),
#: the row's indices i1..i3 and its source ``x`` / destination ``y`` (rows of ne0 contiguous floats)
_ROW_BEGIN = r"""    __shared__ float sh[32];
    const i64 row = blockIdx.x;
    const i64 i1 = row % ne1, i2 = (row / ne1) % ne2, i3 = row / (ne1*ne2);
    const float* x = (const float*)(a + i1*a1 + i2*a2 + i3*a3);
    float* y = (float*)(d + i1*d1 + i2*d2 + i3*d3);
"""

_NORM_SOURCE = r"""
/* mode 0: NORM ((x-mean)/sqrt(var+eps), var = E[x^2]-mean^2 as ggml-cuda), 1: RMS_NORM,
   2: L2_NORM (x/max(|x|, eps)). One block per row; rows contiguous (4-byte elements). */
extern "C" __global__ void ggmlpy_row_norm(
        const char* a, char* d, const i64 ne0, const i64 ne1, const i64 ne2,
        const i64 a1, const i64 a2, const i64 a3, const i64 d1, const i64 d2, const i64 d3,
        const float eps, const int mode) {
""" + _ROW_BEGIN + r"""    float s = 0.0f, q = 0.0f;
    for (i64 i = threadIdx.x; i < ne0; i += blockDim.x) { const float v = x[i]; s += v; q += v*v; }
    q = block_sum(q, sh);
    float shift = 0.0f, inv;
    if (mode == 0) {
        s = block_sum(s, sh);
        shift = s / (float)ne0;
        inv = rsqrtf(q / (float)ne0 - shift*shift + eps);
    } else if (mode == 1) {
        inv = rsqrtf(q / (float)ne0 + eps);
    } else {
        inv = rsqrtf(fmaxf(q, eps*eps));
    }
    for (i64 i = threadIdx.x; i < ne0; i += blockDim.x) y[i] = (x[i] - shift)*inv;
}
"""

_SOFTMAX_SOURCE = r"""
/* softmax(x*scale + slope*mask) over ne0; one block per row; rows contiguous (4-byte elements).
   mask_type 0: none, 1: F32, 2: F16; mask row i1, mask ne2/ne3 broadcast by modulo (m2, m3).
   slope: ALiBi per head i2 when max_bias > 0 (ggml's m0/m1/n_head_log2 rule), else 1. */
extern "C" __global__ void ggmlpy_soft_max(
        const char* a, const char* m, char* d, const i64 ne0, const i64 ne1, const i64 ne2,
        const i64 a1, const i64 a2, const i64 a3, const i64 d1, const i64 d2, const i64 d3,
        const i64 mn2, const i64 mn3, const i64 mb0, const i64 mb1, const i64 mb2, const i64 mb3,
        const int mask_type, const float scale, const float max_bias, const float m0,
        const float m1, const int n_head_log2) {
""" + _ROW_BEGIN + r"""    const char* mrow = m + i1*mb1 + (i2 % mn2)*mb2 + (i3 % mn3)*mb3;
    float slope = 1.0f;
    if (max_bias > 0.0f) {
        slope = i2 < n_head_log2 ? powf(m0, (float)(i2 + 1)) : powf(m1, (float)(2*(i2 - n_head_log2) + 1));
    }
    float mx = __int_as_float(0xff800000);
    for (i64 i = threadIdx.x; i < ne0; i += blockDim.x) {
        float v = x[i]*scale;
        if (mask_type == 1) v += slope*(*(const float*)(mrow + i*mb0));
        else if (mask_type == 2) v += slope*ld_f16(mrow + i*mb0);
        mx = fmaxf(mx, v);
    }
    mx = block_max(mx, sh);
    float s = 0.0f;
    for (i64 i = threadIdx.x; i < ne0; i += blockDim.x) {
        float v = x[i]*scale;
        if (mask_type == 1) v += slope*(*(const float*)(mrow + i*mb0));
        else if (mask_type == 2) v += slope*ld_f16(mrow + i*mb0);
        const float e = expf(v - mx);
        y[i] = e;
        s += e;
    }
    s = block_sum(s, sh);
    const float inv = 1.0f/s;
    for (i64 i = threadIdx.x; i < ne0; i += blockDim.x) y[i] *= inv;
}
"""


def _ew_source(name: str) -> str:
    body = _EW_TEMPLATE.replace("NAME", name).replace("EXPR", _EW_EXPR[name])
    return body.replace("READ_Y", "0.0f" if name in _EW_UNARY else _READ_Y)


#: kernel name -> complete CUDA C translation unit (header included)
SOURCES: dict[str, str] = {f"ggmlpy_ew_{n}": _HEADER + _ew_source(n) for n in _EW_EXPR}
SOURCES["ggmlpy_row_norm"] = _HEADER + _NORM_SOURCE
SOURCES["ggmlpy_soft_max"] = _HEADER + _SOFTMAX_SOURCE

#: all kernels in one translation unit (what CI compiles: one compiler run)
ALL_SOURCE: str = _HEADER + "".join(_ew_source(n) for n in _EW_EXPR) + _NORM_SOURCE + _SOFTMAX_SOURCE

# ---------------------------------------------------------------------------------------------
# which nodes

_BINARY = {Op.ADD: "add", Op.SUB: "sub", Op.MUL: "mul", Op.DIV: "div"}
_UNARY = {UnaryOp.GELU: "gelu", UnaryOp.GELU_ERF: "gelu_erf", UnaryOp.SILU: "silu"}
_GLU = {GluOp.SWIGLU: "swiglu", GluOp.GEGLU: "geglu", GluOp.GEGLU_ERF: "geglu_erf",
        GluOp.REGLU: "reglu"}
_NORM_MODE = {Op.NORM: 0, Op.RMS_NORM: 1, Op.L2_NORM: 2}

#: ops that have a fused kernel (for some node shapes/types: see :func:`supports`)
FUSED_OPS = frozenset(_BINARY) | frozenset(_NORM_MODE) | {Op.SOFT_MAX, Op.UNARY, Op.GLU}


def kernel_name(node: Tensor) -> str | None:
    """The fused kernel's ``extern "C"`` name for ``node``, or None when :func:`supports` is False."""
    if not supports(node):
        return None
    if node.op in _BINARY:
        return f"ggmlpy_ew_{_BINARY[node.op]}"
    if node.op == Op.UNARY:
        return f"ggmlpy_ew_{_UNARY[UnaryOp(node.op_params[0])]}"
    if node.op == Op.GLU:
        return f"ggmlpy_ew_{_GLU[GluOp(node.op_params[0])]}"
    if node.op in _NORM_MODE:
        return "ggmlpy_row_norm"
    return "ggmlpy_soft_max"


def supports(node: Tensor) -> bool:
    """True when ``node`` runs as one fused launch: dst and the data sources F32 (a SOFT_MAX
    mask may be F16), and for the row kernels (norms, SOFT_MAX) ``nb[0] == 4`` on src0 and dst.
    Does not look at the array module: callers check that it is CuPy."""
    op = node.op
    srcs = [s for s in node.src if s is not None]
    if node.type != Type.F32 or not srcs or srcs[0].type != Type.F32:
        return False
    if op in _BINARY:
        return len(srcs) == 2 and srcs[1].type == Type.F32
    if op == Op.UNARY:
        return UnaryOp(node.op_params[0]) in _UNARY
    if op == Op.GLU:
        if GluOp(node.op_params[0]) not in _GLU:
            return False
        return len(srcs) == 1 or srcs[1].type == Type.F32
    if op in _NORM_MODE or op == Op.SOFT_MAX:
        if node.nb[0] != 4 or srcs[0].nb[0] != 4:
            return False
        if op == Op.SOFT_MAX:
            if len(node.src) > 2 and node.src[2] is not None:
                return False  # attention sinks: not fused
            if len(srcs) > 1 and srcs[1].type not in (Type.F32, Type.F16):
                return False
        return True
    return False


# ---------------------------------------------------------------------------------------------
# launching

_lock = threading.Lock()
_launches = [0]
_kernel_cache: dict[tuple[int, str], Any] = {}


def launch_count() -> int:
    """Fused kernel launches issued so far in this process (all devices and streams)."""
    return _launches[0]


def _kernel(xp: Any, name: str) -> Any:
    """The compiled kernel ``name``: every kernel lives in one ``xp.RawModule`` over
    :data:`ALL_SOURCE` (one NVRTC compile per process and device, done by CuPy on first use and
    kept in its kernel cache on disk); this cache only avoids re-creating the Python objects."""
    key = (id(xp), name)
    k = _kernel_cache.get(key)
    if k is None:
        mkey = (id(xp), "")
        mod = _kernel_cache.get(mkey)
        if mod is None:
            mod = xp.RawModule(code=ALL_SOURCE)
            _kernel_cache[mkey] = mod
        k = mod.get_function(name)
        _kernel_cache[key] = k
    return k


def _launcher(xp: Any, name: str, grid: int, block: int, args: tuple[Any, ...]) -> Step:
    """A step launching kernel ``name``; the module is compiled/loaded on the first launch, not
    while the plan is built (building a plan does no device work)."""
    g, b = (grid,), (block,)
    k: list[Any] = []

    def run() -> None:
        if not k:
            k.append(_kernel(xp, name))
        k[0](g, b, args)
        with _lock:
            _launches[0] += 1
    return run


def _i64(*v: int) -> tuple[np.int64, ...]:
    return tuple(np.int64(x) for x in v)


def _ne_nb(arr: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """ggml order (ne0..ne3, nb0..nb3) of a 4-D view with NumPy shape ne[::-1]."""
    if arr.ndim != 4:
        raise ValueError(f"cuda_kernels: expected a 4-D view, got shape {arr.shape}")
    return tuple(arr.shape[::-1]), tuple(arr.strides[::-1])


def make(xp: Any, node: Tensor, dst: Any, srcs: list[Any]) -> Step:
    """The fused kernel for ``node`` as a zero-argument step that enqueues **one** launch on the
    current stream (asynchronous). ``dst``/``srcs`` are 4-D ``xp`` views (shape ``ne[::-1]``,
    byte strides ``nb[::-1]``) as the kernels registry passes them.

    Raises:
        ValueError: ``node`` is not supported (check :func:`supports` first).
    """
    name = kernel_name(node)
    if name is None:
        raise ValueError(f"cuda_kernels.make: node {node.name!r} ({node.op.name}) has no fused kernel")
    if node.op in _NORM_MODE:
        return _make_norm(xp, node, dst, srcs, name)
    if node.op == Op.SOFT_MAX:
        return _make_soft_max(xp, node, dst, srcs, name)
    return _make_ew(xp, node, dst, srcs, name)


def _make_ew(xp: Any, node: Tensor, dst: Any, srcs: list[Any], name: str) -> Step:
    a = srcs[0]
    b = srcs[1] if len(srcs) > 1 and srcs[1] is not None else None
    if node.op == Op.GLU and b is None:
        n = dst.shape[-1]
        swapped = bool(node.op_params[1]) if len(node.op_params) > 1 else False
        x, g = (a[..., n:2 * n], a[..., :n]) if swapped else (a[..., :n], a[..., n:2 * n])
        a, b = x, g
    if b is None:
        b = a  # unary: never read
    ne, dnb = _ne_nb(dst)
    _, anb = _ne_nb(a)
    bne, bnb = _ne_nb(b)
    n = ne[0] * ne[1] * ne[2] * ne[3]
    if n == 0:
        return lambda: None
    grid = min((n + _BLOCK_EW - 1) // _BLOCK_EW, _MAX_GRID_EW)
    args = (a, b, dst) + _i64(n, ne[0], ne[1], ne[2], *anb, *bne, *bnb, *dnb)
    return _launcher(xp, name, grid, _BLOCK_EW, args)


def _row_block(ne0: int) -> int:
    """Threads per row: a multiple of 32, at most 1024, about one element per thread."""
    return max(32, min(1024, 1 << max(5, math.ceil(math.log2(max(ne0, 1))))))


def _make_norm(xp: Any, node: Tensor, dst: Any, srcs: list[Any], name: str) -> Step:
    ne, dnb = _ne_nb(dst)
    _, anb = _ne_nb(srcs[0])
    rows = ne[1] * ne[2] * ne[3]
    if rows == 0 or ne[0] == 0:
        return lambda: None
    args = (srcs[0], dst) + _i64(ne[0], ne[1], ne[2], anb[1], anb[2], anb[3], dnb[1], dnb[2],
                                 dnb[3]) + (np.float32(node.op_params[0]),
                                            np.int32(_NORM_MODE[node.op]))
    return _launcher(xp, name, rows, _row_block(ne[0]), args)


def _make_soft_max(xp: Any, node: Tensor, dst: Any, srcs: list[Any], name: str) -> Step:
    p = node.op_params
    scale = float(p[0]) if len(p) > 0 else 1.0
    max_bias = float(p[1]) if len(p) > 1 else 0.0
    ne, dnb = _ne_nb(dst)
    _, anb = _ne_nb(srcs[0])
    rows = ne[1] * ne[2] * ne[3]
    if rows == 0 or ne[0] == 0:
        return lambda: None
    mask = srcs[1] if len(srcs) > 1 else None
    if mask is None:
        m, mtype, mne, mnb = srcs[0], 0, (1, 1, 1, 1), (0, 0, 0, 0)
    else:
        m = mask
        mtype = 1 if mask.dtype == np.float32 else 2
        mne, mnb = _ne_nb(mask)
    n_head = ne[2]
    n_log2 = 2 ** int(math.floor(math.log2(n_head))) if n_head > 0 else 1
    m0 = float(np.float32(2.0) ** np.float32(-max_bias / n_log2))
    m1 = float(np.float32(2.0) ** np.float32(-(max_bias / 2.0) / n_log2))
    args = ((srcs[0], m, dst)
            + _i64(ne[0], ne[1], ne[2], anb[1], anb[2], anb[3], dnb[1], dnb[2], dnb[3],
                   mne[2], mne[3], *mnb)
            + (np.int32(mtype), np.float32(scale), np.float32(max_bias), np.float32(m0),
               np.float32(m1), np.int32(n_log2)))
    return _launcher(xp, name, rows, _row_block(ne[0]), args)


def is_cuda(xp: Any) -> bool:
    """True when ``xp`` can launch :data:`SOURCES` (CuPy, or the test suite's fake CuPy)."""
    # NumPy first: hasattr on the numpy module goes through its lazy __getattr__ and raises
    # (~4 us), once per kernel compiled for the CPU
    return xp is not np and hasattr(xp, "RawModule")


def supports_on(node: Tensor, xp: Any) -> bool:
    """The override predicate: ``xp`` launches CUDA kernels (:func:`is_cuda`) and ``node`` has a
    fused kernel (:func:`supports`)."""
    return is_cuda(xp) and supports(node)


def register(registry: Any) -> None:
    """Stack :func:`make` over the generic kernel of each op of :data:`FUSED_OPS` in
    ``registry`` (a :class:`~ggmlpy.backends.kernels.registry.KernelRegistry`), with
    :func:`supports_on` as predicate. Raises ValueError when already registered there."""
    for op in sorted(FUSED_OPS, key=lambda o: o.value):
        registry.override(op, make, supports=supports_on, name="cuda.fused")
