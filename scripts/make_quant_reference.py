"""Write tests/data/ggml_q8_reference.npz: ggml's own activation quantizers and vec_dot results.

Run under the reference venv (never a ggmlpy dependency):

    $GGMLPY_REF_PYTHON scripts/make_quant_reference.py

Source: ggml-python 0.0.45 (PyPI; its bundled ggml shared libraries built on this x86-64 machine
with GGML_NATIVE: AVX512, AVX512_VNNI), called through ctypes:

* ``ggml_get_type_traits(t).from_float_ref`` -- ggml-quants.c ``quantize_row_q8_0_ref``,
  ``quantize_row_q8_1_ref`` (and the reference quantizers of the weight types,
  ``ggml_fp32_to_fp16_row``, ``ggml_fp32_to_bf16_row_ref``). This ggml gives Q8_K no
  ``from_float_ref``; its reference ``quantize_row_q8_K_ref`` is reached through the CPU
  backend's ``from_float`` of Q8_K, which on x86 is that function (ggml-cpu/arch/x86/quants.c
  ``quantize_row_q8_K``);
* ``ggml_get_type_traits_cpu(t).from_float`` -- the CPU backend's (SIMD) activation quantizers;
* ``ggml_get_type_traits_cpu(t).vec_dot`` -- the CPU backend's (SIMD) dot products.

Arrays written (K = 512 elements per row; every row is 16 Q8_0/Q8_1 blocks or 2 Q8_K blocks):

* ``x``: float32 (R, 512) activation rows, one kind of input per row (see ``_rows``: normal,
  uniform, mixed sign, 1e30 and near-float32-max, 1e-30, float32 subnormals (1e-40, 1e-44, the
  thresholds where ``1/d`` overflows), zeros, half-way ties of ``x / d``, sparse, integers).
* ``ref_<kind>`` / ``cpu_<kind>``: uint8 (R, row_bytes) from ``from_float_ref`` / ``from_float``
  for kind in q8_0, q8_1, q8_K.
* ``w_<type>``: uint8 (M, row_bytes) weight rows (``from_float_ref`` of ``wx``, float32 (M, 512)
  standard normal rows, M = 8); ``y_<type>``: the activation rows ``x`` in the type's
  ``vec_dot_type`` from ``from_float_ref``; ``dot_<type>``: float32 (R, M) of
  ``vec_dot(512, w[m], y[n])`` (ggml's SIMD kernel) for the types q4_0, q4_1, q5_0, q5_1, q8_0,
  q4_K, q5_K, q6_K, f16, bf16.
"""

from __future__ import annotations

import ctypes
import os

import ggml
import numpy as np

K = 512
M = 8
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "data", "ggml_q8_reference.npz")

TYPES = {"q4_0": ggml.GGML_TYPE_Q4_0, "q4_1": ggml.GGML_TYPE_Q4_1, "q5_0": ggml.GGML_TYPE_Q5_0,
         "q5_1": ggml.GGML_TYPE_Q5_1, "q8_0": ggml.GGML_TYPE_Q8_0, "q4_K": ggml.GGML_TYPE_Q4_K,
         "q5_K": ggml.GGML_TYPE_Q5_K, "q6_K": ggml.GGML_TYPE_Q6_K, "f16": ggml.GGML_TYPE_F16,
         "bf16": ggml.GGML_TYPE_BF16}
ACT = {"q8_0": ggml.GGML_TYPE_Q8_0, "q8_1": ggml.GGML_TYPE_Q8_1, "q8_K": ggml.GGML_TYPE_Q8_K}


def _rows(rng: np.random.Generator) -> np.ndarray:
    rows = [rng.standard_normal(K), rng.uniform(-1, 1, K), rng.uniform(0, 1, K),
            -rng.uniform(0, 1, K), rng.standard_normal(K) * 1e30,
            rng.uniform(-1, 1, K) * 3.4e38, rng.standard_normal(K) * 1e-30,
            rng.standard_normal(K) * 1e-40, rng.standard_normal(K) * 1e-44, np.zeros(K)]
    # the thresholds: amax where d = amax/127 is subnormal, where 1/d overflows, and just above
    for amax in (3.0e-37, 3.7e-37, 3.8e-37, 1.2e-36, 1.5e-36, 2.0e-36, 1.17549435e-38):
        r = rng.uniform(-1, 1, K) * amax
        r[::32] = amax  # every Q8_0 block and Q8_K super-block reaches amax
        rows.append(r)
    # ties: amax 127 -> d = 1 -> x / d half-way values; Q8_K: max = -127 -> iscale = 1
    t = rng.integers(-126, 126, K) + 0.5
    t[::32] = 127.0
    rows.append(t)
    t = rng.integers(-126, 126, K) + 0.5
    t[::256] = -127.0
    rows.append(t)
    s = rng.standard_normal(K)
    s[rng.random(K) < 0.7] = 0
    rows.append(s)
    s = np.zeros(K)
    s[5] = -2.0
    s[300] = 1e-3
    rows.append(s)                                   # whole blocks of zeros beside non-zero ones
    rows.append(rng.integers(-8, 8, K).astype(float))
    rows.append(rng.laplace(0, 1, K) * 100)
    mixed = rng.standard_normal(K)
    mixed[0:32] *= 1e20
    mixed[32:64] *= 1e-20
    mixed[256:288] *= 1e-39
    rows.append(mixed)
    return np.asarray(rows, dtype=np.float32)


def _ptr(a: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data)


def _from_float(fn, x: np.ndarray, row_bytes: int) -> np.ndarray:
    out = np.zeros((x.shape[0], row_bytes), np.uint8)
    for i in range(x.shape[0]):
        xi = np.ascontiguousarray(x[i])
        fn(xi.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), _ptr(out[i]), K)
    return out


def _ref_fn(t: int):
    """``from_float_ref`` of type ``t``, or the CPU's ``from_float`` where the former is NULL
    (Q8_K, see the module docstring)."""
    fn = ggml.ggml_get_type_traits(t).contents.from_float_ref
    if ctypes.cast(fn, ctypes.c_void_p).value is None:
        fn = ggml.ggml_get_type_traits_cpu(t).contents.from_float
    return fn


def _row_bytes(t: int) -> int:
    tr = ggml.ggml_get_type_traits(t).contents
    return K // tr.blck_size * tr.type_size


def main() -> None:
    ggml.ggml_cpu_init()
    rng = np.random.default_rng(20261201)
    x = _rows(rng)
    out: dict[str, np.ndarray] = {"x": x}
    for kind, t in ACT.items():
        nb = _row_bytes(t)
        out[f"ref_{kind}"] = _from_float(_ref_fn(t), x, nb)
        out[f"cpu_{kind}"] = _from_float(ggml.ggml_get_type_traits_cpu(t).contents.from_float, x, nb)
    wx = rng.standard_normal((M, K)).astype(np.float32)
    out["wx"] = wx
    for name, t in TYPES.items():
        w = _from_float(_ref_fn(t), wx, _row_bytes(t))
        cpu = ggml.ggml_get_type_traits_cpu(t).contents
        vt = cpu.vec_dot_type
        y = _from_float(_ref_fn(vt), x, _row_bytes(vt))
        dot = np.zeros((x.shape[0], M), np.float32)
        s = ctypes.c_float()
        for n in range(x.shape[0]):
            for m in range(M):
                cpu.vec_dot(K, ctypes.byref(s), 0, _ptr(w[m]), 0, _ptr(y[n]), 0, 1)
                dot[n, m] = s.value
        out[f"w_{name}"], out[f"y_{name}"], out[f"dot_{name}"] = w, y, dot
        print(name, "vec_dot_type", vt, w.shape, y.shape)
    np.savez_compressed(OUT, **out)
    print("wrote", os.path.normpath(OUT), sum(v.nbytes for v in out.values()), "bytes")


if __name__ == "__main__":
    main()
