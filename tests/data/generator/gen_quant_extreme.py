"""Reference blocks of ggml's quantizers on extreme inputs -> ggml_quant_extreme.npz.

Run in a scratch directory holding ``quant_driver`` built against ggml's ``src/ggml-quants.c``
compiled with ``-O2 -std=gnu11 -DNDEBUG`` (NDEBUG as in ggml's release builds: huge inputs make
``nearest_int``'s assert fire otherwise). Inputs are finite float32 only: ggmlpy's ``quantize``
refuses NaN and inf for the block types instead of writing ggml's unspecified bytes.

Output keys: ``x`` (float32), ``names`` (one name per 256-value segment), and for each type
``<type>_bytes`` (``quantize_row_<type>_ref``) and ``<type>_deq`` (``dequantize_row_<type>``).
"""
import subprocess

import numpy as np

N = 256
rng = np.random.default_rng(20261202)
segs: dict[str, np.ndarray] = {}
for e in [4, 5, 6, 7, 8, 9, 10, 12, 15, 18, 20, 25, 30, 35, 38]:
    m = 10.0 ** e
    segs[f"normal_1e{e}"] = rng.standard_normal(N) * m
    segs[f"const_1e{e}"] = np.full(N, m)
    s = rng.standard_normal(N)
    s[5] = m
    segs[f"outlier_1e{e}"] = s
    s = rng.standard_normal(N) * 0.01
    s[rng.integers(0, N, 3)] = [m, -m, m / 10]
    segs[f"mixed_1e{e}"] = s
for e in [-5, -8, -10, -15, -20, -30, -38]:
    segs[f"tiny_1e{e}"] = rng.standard_normal(N) * 10.0 ** e
segs["subnormal"] = rng.standard_normal(N) * 1e-40
segs["min_subnormal"] = rng.choice([-1.0, 0.0, 1.0], N) * 1.4e-45
segs["flt_max"] = rng.choice([-1.0, 1.0], N) * 3.4028235e38
segs["zeros"] = np.zeros(N)
segs["neg_zeros"] = -np.zeros(N)
segs["fp16_max"] = np.full(N, 65504.0)
segs["q8_edge"] = rng.standard_normal(N) * 65504 * 127
# random mixes: every group of 16 its own magnitude 10**U(-45, 38.5), constant groups,
# groups with one non-zero, scattered -0.0
for k in range(16):
    mags = 10.0 ** rng.uniform(-45, 38.5, N // 16)
    s = rng.standard_normal((N // 16, 16)) * mags[:, None]
    kind = rng.integers(0, 4, N // 16)
    s[kind == 1] = mags[kind == 1, None] * rng.choice([-1.0, 1.0])
    s[kind == 2, 1:] = 0
    s = s.reshape(-1)
    s[rng.random(N) < 0.05] = -0.0
    segs[f"random_mix_{k}"] = s
with np.errstate(over="ignore"):
    x = np.concatenate(list(segs.values())).astype(np.float32)
x = np.where(np.isfinite(x), x, np.float32(3.4e38)).astype(np.float32)
x.tofile("ext.f32")
out = {"x": x, "names": np.array(list(segs))}
for t in ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_K", "q5_K", "q6_K"]:
    subprocess.run(["./quant_driver", "ext.f32", str(x.size), t, f"{t}.bin", f"{t}.f32"], check=True)
    out[f"{t.lower()}_bytes"] = np.fromfile(f"{t}.bin", np.uint8)
    out[f"{t.lower()}_deq"] = np.fromfile(f"{t}.f32", np.float32)
np.savez_compressed("ggml_quant_extreme.npz", **out)
for k, v in out.items():
    print(k, v.shape, v.dtype)
