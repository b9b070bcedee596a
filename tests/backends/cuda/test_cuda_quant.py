"""Device dequantization (ggmlpy/backends/cuda/quant.py) and ops on quantized/BF16 tensors on the
device backends.

* Every CUDA source compiles without a GPU (NVRTC through CuPy's bindings, else nvcc).
* The NumPy emulation of each kernel (tests/fake_cupy_quant.py, written from the CUDA formulas)
  is bit-identical to ``ggmlpy.dequantize`` on every block type: so the device path computes
  ggml's reference values, not just something close.
* MUL_MAT / GET_ROWS / CPY on quantized and BF16 tensors give the CPU's values on SIM0 (same
  NumPy kernels, device memory) and on the fake CuPy (device code path: RawKernel dequantization,
  ``dot``/``matmul`` for the GEMM), and the CuPy predicates refuse quantizing on the device.
"""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

pytest.importorskip("gguf")  # the CPU reference dequantizes the legacy types with gguf-py

import fake_cupy_quant

from ggmlpy import ops  # noqa: E402
from ggmlpy.alloc.tallocr import alloc_ctx_tensors
from ggmlpy.backend.tensor_data import backend_tensor_get, backend_tensor_set
from ggmlpy.backends.cpu.backend import backend_cpu_init
from ggmlpy.backends.cuda import quant as cuda_quant
from ggmlpy.core.graph import Graph
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type
from ggmlpy.quants import dequantize, quantize

QTYPES = list(cuda_quant.KERNEL_NAMES)


def _compile_nvrtc(src: str) -> bool | None:
    try:
        from cupy_backends.cuda.libs import nvrtc  # noqa: PLC0415
        prog = nvrtc.createProgram(src, "ggmlpy_quant.cu", [], [])
    except Exception:  # noqa: BLE001 - no CuPy or no libnvrtc here
        return None
    try:
        nvrtc.compileProgram(prog, ["-arch=compute_80"])
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"NVRTC rejected the kernels: {e}\n{nvrtc.getProgramLog(prog)}")
    return True


def _compile_nvcc(src: str, tmp_path) -> bool | None:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    f = tmp_path / "k.cu"
    f.write_text(src)
    r = subprocess.run([nvcc, "-arch=sm_80", "-ptx", "-o", str(tmp_path / "k.ptx"), str(f)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return True


def test_every_dequant_source_compiles_without_a_gpu(tmp_path):
    ok = _compile_nvrtc(cuda_quant.ALL_SOURCE) or _compile_nvcc(cuda_quant.ALL_SOURCE, tmp_path)
    if ok is None:
        pytest.skip("neither libnvrtc (CuPy's bindings) nor nvcc is available")
    for name, src in cuda_quant.SOURCES.items():
        assert f"void {name}(" in src


@pytest.mark.parametrize("t", QTYPES)
def test_kernel_emulation_is_bit_identical_to_ggml_dequantize(t):
    rng = np.random.default_rng(int(t))
    # values with outliers so every scale/min code path and sign is exercised
    x = (rng.standard_normal((6, 512)) * rng.uniform(0.01, 30, (6, 1))).astype(np.float32)
    x[0, :256] = 0.0
    raw = quantize(x, t)
    out = np.empty((6, 512), np.float32)
    i64 = np.int64
    fake_cupy_quant.run_dequant(cuda_quant.kernel_name(t),
                                (raw, out, i64(out.size), i64(512), i64(6), i64(1),
                                 i64(raw.strides[0]), i64(raw.nbytes), i64(raw.nbytes)))
    want = dequantize(raw, t, (512, 6))
    np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))


def test_dequantize_rows_rejects_wrong_inputs():
    xp = np
    with pytest.raises(ValueError, match="no device dequantizer"):
        cuda_quant.dequantize_rows(xp, Type.F16, np.zeros((2, 64), np.uint8), 32)
    with pytest.raises(ValueError, match="expected uint8 rows of 34"):
        cuda_quant.dequantize_rows(xp, Type.Q8_0, np.zeros((2, 35), np.uint8), 32)


# ---------------------------------------------------------------------------------------------
# ops on the device backends


def _graph_on(backend, t: Type, seed: int):
    """MUL_MAT (weight of type t), GET_ROWS (of t), CPY t -> F32 and F32 -> t (if supported)."""
    k = 256
    rng = np.random.default_rng(seed)
    ctx = Context(no_alloc=True)
    w = ctx.new_tensor(t, (k, 12, 2))
    x = ctx.new_tensor(Type.F32, (k, 3, 2))
    idx = ctx.new_tensor(Type.I32, (4, 2))
    mm = ops.mul_mat(ctx, w, x)
    gr = ops.get_rows(ctx, w, idx)
    cp_out = ops.cpy(ctx, w, ctx.new_tensor(Type.F32, (k, 12, 2)))
    outs = [mm, gr, cp_out]
    q_in = ctx.new_tensor(Type.F32, (k, 2))
    q_out = ops.cpy(ctx, q_in, ctx.new_tensor(t, (k, 2)))
    if backend.supports_op(q_out):
        outs.append(q_out)
    for o in outs[:3]:
        assert backend.supports_op(o), (backend.name, o.op.name, t.name)
    buf = alloc_ctx_tensors(ctx, backend)
    try:
        backend_tensor_set(w, quantize(rng.uniform(-1, 1, (2, 12, k)).astype(np.float32), t))
        backend_tensor_set(x, rng.uniform(-1, 1, (2, 3, k)).astype(np.float32))
        backend_tensor_set(idx, rng.integers(0, 12, (2, 4)).astype(np.int32))
        backend_tensor_set(q_in, rng.uniform(-1, 1, (2, k)).astype(np.float32))
        g = Graph(64)
        for o in outs:
            g.build_forward_expand(o)
        backend.graph_compute(g)
        return [np.asarray(backend_tensor_get(o)).reshape(-1).view(np.uint8).copy() for o in outs]
    finally:
        buf.free()


@pytest.mark.parametrize("t", QTYPES + [Type.F16, Type.BF16])
@pytest.mark.backends("SIM0", "FAKECUDA0", "CUDA0")
def test_device_ops_on_quantized_and_bf16_match_the_cpu(t, backend, backend_kind, monkeypatch):
    launches = fake_cupy_quant.LAUNCHES[0]
    got = _graph_on(backend, t, int(t))
    if backend_kind == "FAKECUDA0" and t.is_quantized:  # dequantized by the device kernel, not the host
        assert fake_cupy_quant.LAUNCHES[0] >= launches + 3
    if backend_kind != "SIM0":
        # the CuPy MUL_MAT multiplies the dequantized weight: so does the CPU's dequant path (its
        # default small-batch path quantizes the activations as ggml-cpu does, as SIM does too)
        monkeypatch.setenv("GGMLPY_QUANT_MATMUL", "dequant")
    cpu = backend_cpu_init()
    want = _graph_on(cpu, t, int(t))
    # CuPy quantizing is refused (host-only quantizer): then it has one output fewer
    if backend_kind != "SIM0" and t.is_quantized:
        assert len(got) == 3 and len(want) == 4
    else:
        assert len(got) == len(want)
    # dequantized values are bit-identical; GEMMs agree to float32 rounding (K = 256 terms of
    # magnitude <= 1: another BLAS's summation order moves results by ~1e-6 relative)
    mm_g, mm_w = got[0].view(np.float32), want[0].view(np.float32)
    np.testing.assert_allclose(mm_g, mm_w, rtol=1e-5, atol=1e-4)
    for a, b in zip(got[1:], want[1:]):
        np.testing.assert_array_equal(a, b)
