import subprocess

import numpy as np

rng = np.random.default_rng(20261201)
segs = []
n = 256
segs.append(rng.standard_normal(n))
segs.append(rng.uniform(-1, 1, n))
segs.append(rng.standard_normal(n) * 1e-3)
segs.append(rng.standard_normal(n) * 1e4)
segs.append(np.zeros(n))
segs.append(np.full(n, 0.5))
segs.append(np.full(n, -3.0))
s = rng.standard_normal(n) * 0.01
s[rng.integers(0, n, 4)] = [40, -55, 7, -9]
segs.append(s)
segs.append(rng.uniform(0, 1, n))
segs.append(-rng.uniform(0, 1, n))
segs.append(rng.standard_normal(n) * 1e-30)
s = rng.standard_normal(n)
s[rng.random(n) < 0.5] = 0
segs.append(s)
segs.append(rng.standard_normal(n) * 100)
segs.append(rng.integers(-8, 8, n).astype(float))
s = rng.standard_normal(n)
s[32:64] = 0
s[160:192] = 1.0
segs.append(s)
segs.append(rng.laplace(0, 1, n))
x = np.concatenate(segs).astype(np.float32)
x.tofile("in.f32")
out = {"x": x}
for t in ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_K", "q5_K", "q6_K"]:
    subprocess.run(["./quant_driver", "in.f32", str(x.size), t, f"{t}.bin", f"{t}.f32"], check=True)
    out[f"{t.lower()}_bytes"] = np.fromfile(f"{t}.bin", np.uint8)
    out[f"{t.lower()}_deq"] = np.fromfile(f"{t}.f32", np.float32)
np.savez_compressed("ggml_quant_vectors.npz", **out)
for k, v in out.items():
    print(k, v.shape, v.dtype)
# F16 / BF16 conversions: the same inputs plus special values
rng2 = np.random.default_rng(7)
sp = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 65504, 65520, 65519.99, 1e-8, 6e-8, 5.96e-8, 3e-8,
               1e38, 3.4e38, -3.4e38, 1.00390625, 1.001953125, 1.0029296875, 1e-40, -1e-45], np.float32)
bits = rng2.integers(0, 2**32, 1024, dtype=np.uint64).astype(np.uint32).view(np.float32)
cx = np.concatenate([sp, bits, x[:1024]]).astype(np.float32)
qnan = np.array([0x7f800001, 0xff800123, 0x7fc00000], np.uint32).view(np.float32)
cx = np.concatenate([cx, qnan])
cx.tofile("conv.f32")
subprocess.run(["./conv_driver", "conv.f32", str(cx.size)], check=True)
out["conv_x"] = cx
out["f16_bits"] = np.fromfile("f16.bin", np.uint16)
out["bf16_bits"] = np.fromfile("bf16.bin", np.uint16)
np.savez_compressed("ggml_quant_vectors.npz", **out)
print("conv", cx.size)
