"""Write tests/data/ggml_q8_x86_reference.npz: ggml-cpu's x86 activation quantizers on edge cases.

Run under the reference venv (never a ggmlpy dependency):

    $GGMLPY_REF_PYTHON scripts/make_q8_arch_reference.py

Source: ggml-python 0.0.45 (PyPI; its bundled ggml built from source on this x86-64 machine with
GGML_NATIVE: AVX2, F16C, FMA, AVX-512), through ctypes:
``ggml_get_type_traits_cpu(t).from_float`` for t in Q8_0, Q8_1, Q8_K -- the functions the CPU
backend's MUL_MAT applies to ``src1`` (ggml-cpu.c ``ggml_compute_forward_mul_mat`` calls
``type_traits_cpu[vec_dot_type].from_float``): ggml-cpu/arch/x86/quants.c ``quantize_row_q8_0``,
``quantize_row_q8_1`` (their AVX/AVX2 branch) and ``quantize_row_q8_K`` (the reference loop).

Arrays written (K = 256 elements per row: 8 Q8_0/Q8_1 blocks, 1 Q8_K block):

* ``x``: float32 (R, 256) rows, one case per row (see ``_rows``): normal and uniform rows; exact
  ties of ``x * 127 / amax`` (amax 127, 63.5 and 254); amax values where ``127 / amax`` and
  ``1 / (amax / 127)`` differ; subnormal rows and the amax thresholds where ``127 / amax``
  overflows; zero, -0 and single-element blocks; +-inf, NaN and -NaN in each of the four 8-lane
  vectors of a block and in its first lanes (where AVX ``maxps`` drops a NaN); huge values.
* ``cpu_q8_0``, ``cpu_q8_1``, ``cpu_q8_K``: uint8 (R, row_bytes), ``from_float`` of every row.
* ``mm_rows``: int64 indices of the rows of ``x`` that are finite; ``w_<type>``: uint8 (256,
  row_bytes) weight rows whose row ``m`` is one-hot at element ``m`` (``from_float_ref`` of the
  identity), and ``mm_<type>``: float32 (len(mm_rows), 256), ggml's CPU ``ggml_mul_mat(w, x)``
  on those rows (one thread), for type in q8_0 and q4_1: each output is one activation element's
  ``d_w * d_a * q_w * q_a``, so the activation quants the MUL_MAT itself used show through.
"""

from __future__ import annotations

import ctypes
import os

import ggml
import numpy as np

K = 256
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "data", "ggml_q8_x86_reference.npz")
ACT = {"q8_0": ggml.GGML_TYPE_Q8_0, "q8_1": ggml.GGML_TYPE_Q8_1, "q8_K": ggml.GGML_TYPE_Q8_K}


def _rows(rng: np.random.Generator) -> np.ndarray:
    rows = [rng.standard_normal(K), rng.uniform(-1, 1, K), rng.laplace(0, 1, K) * 50]
    for amax in (127.0, 63.5, 254.0):          # x * 127 / amax half-way: ties in every block
        t = (rng.integers(-126, 126, K) + 0.5) * (amax / 127.0)
        t[::32] = amax
        t[1::32] = -amax / 127.0 * 0.5          # -0.5: rounds to -0 / -1
        t[2::32] = amax / 127.0 * 1.5           # 1.5: rounds to 2 both ways
        rows.append(t)
    # amax where 127/amax and 1/(amax/127) round differently; values near half-way points
    r = rng.uniform(-1, 1, K).astype(np.float32)
    amaxes = rng.uniform(0.5, 2.0, K // 32).astype(np.float32)
    for b, a in enumerate(amaxes):
        blk = r[b * 32:(b + 1) * 32]
        q = rng.integers(-126, 126, 32)
        blk[:] = (q + 0.5) * (a / np.float32(127))
        blk[0] = a
    rows.append(r)
    rows += [rng.standard_normal(K) * 1e-38, rng.standard_normal(K) * 1e-40,
             rng.standard_normal(K) * 1e-44]
    for amax in (3.0e-37, 3.7e-37, 3.73e-37, 3.74e-37, 3.8e-37, 1.0e-36, 1.17549435e-38):
        r = rng.uniform(-1, 1, K) * amax
        r[::32] = amax
        r[5::32] = 0.0
        rows.append(r)
    z = rng.standard_normal(K)
    z[0:32] = 0.0
    z[32:64] = -0.0
    z[64:96] = 0.0
    z[70] = 1e-3
    z[96:128] = 0.0
    z[127] = -5.0
    rows.append(z)
    rows.append(np.zeros(K))
    rows.append(np.full(K, -0.0))
    for val in (np.inf, -np.inf, np.nan, -np.nan):
        for lanes in ((0,), (3,), (7,), (8,), (15,), (16,), (24,), (31,), (0, 8), (0, 1, 2, 3, 4, 5, 6, 7)):
            r = rng.standard_normal(K)
            for b in range(K // 32):           # the case in block 0, shifted lanes in the others
                for ln in lanes:
                    r[b * 32 + (ln + b) % 32] = val
            rows.append(r)
    r = rng.standard_normal(K)
    r[0:32:3] = np.inf
    r[32:64:2] = np.inf                        # 16 inf: Q8_1's int32 sum wraps to 0
    r[64] = np.inf
    r[65] = np.nan
    r[96] = np.nan
    r[97] = -np.inf
    rows.append(r)
    rows += [rng.uniform(-1, 1, K) * 3.4e38, rng.standard_normal(K) * 1e6,
             rng.standard_normal(K) * 1e5]     # d beyond f16's range
    s = rng.integers(-8, 8, K).astype(float)
    rows.append(s)
    return np.asarray(rows, dtype=np.float32)


def _from_float(fn, x: np.ndarray, row_bytes: int) -> np.ndarray:
    out = np.zeros((x.shape[0], row_bytes), np.uint8)
    for i in range(x.shape[0]):
        xi = np.ascontiguousarray(x[i])
        fn(xi.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), ctypes.c_void_p(out[i].ctypes.data), K)
    return out


def _mul_mat(t: int, wb: np.ndarray, x: np.ndarray) -> np.ndarray:
    """ggml's CPU MUL_MAT of weight rows ``wb`` (type ``t``, 256 rows of K) with float32 ``x``."""
    n = x.shape[0]
    ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=64 << 20, mem_buffer=None))
    w = ggml.ggml_new_tensor_2d(ctx, t, K, K)
    b = ggml.ggml_new_tensor_2d(ctx, ggml.GGML_TYPE_F32, K, n)
    y = ggml.ggml_mul_mat(ctx, w, b)
    gf = ggml.ggml_new_graph(ctx)
    ggml.ggml_build_forward_expand(gf, y)
    ctypes.memmove(ggml.ggml_get_data(w), wb.ctypes.data, wb.nbytes)
    xc = np.ascontiguousarray(x, dtype=np.float32)
    ctypes.memmove(ggml.ggml_get_data(b), xc.ctypes.data, xc.nbytes)
    ggml.ggml_graph_compute_with_ctx(ctx, gf, 1)
    out = np.empty((n, K), np.float32)
    ctypes.memmove(out.ctypes.data, ggml.ggml_get_data(y), out.nbytes)
    ggml.ggml_free(ctx)
    return out


def main() -> None:
    ggml.ggml_cpu_init()
    rng = np.random.default_rng(20261202)
    with np.errstate(invalid="ignore"):
        x = _rows(rng)
    out: dict[str, np.ndarray] = {"x": x}
    for kind, t in ACT.items():
        tr = ggml.ggml_get_type_traits(t).contents
        nb = K // tr.blck_size * tr.type_size
        out[f"cpu_{kind}"] = _from_float(ggml.ggml_get_type_traits_cpu(t).contents.from_float, x, nb)
    rows = np.where(np.isfinite(x).all(axis=1))[0]
    out["mm_rows"] = rows
    eye = np.eye(K, dtype=np.float32)
    for name, t in (("q8_0", ggml.GGML_TYPE_Q8_0), ("q4_1", ggml.GGML_TYPE_Q4_1)):
        tr = ggml.ggml_get_type_traits(t).contents
        w = _from_float(tr.from_float_ref, eye, K // tr.blck_size * tr.type_size)
        out[f"w_{name}"] = w
        out[f"mm_{name}"] = _mul_mat(t, w, x[rows])
    np.savez_compressed(OUT, **out)
    print("wrote", os.path.normpath(OUT), x.shape, sum(v.nbytes for v in out.values()), "bytes")


if __name__ == "__main__":
    main()
