"""Write ggml-cpu's ROPE outputs (``ggml_rope_ext``) for the CPU's ``cpu.jit.rope`` variant.

Reference tool only: it runs under the reference venv (ggml-python, named by $GGMLPY_REF_PYTHON;
see tests/data/README.md), never under ggmlpy's, and ggmlpy never imports it.

For each case of ``CASES`` (mode, freq_base, head size ``d``, rotated dims ``n_dims``) it rotates
``x = default_rng(SEED + k).standard_normal((T, 1, d)) * 3`` (float32; ggml ``ne = [d, 1, T]``)
at the positions ``POSITIONS`` (``T = 32``, up to 32767) with ``ggml_rope_ext(ctx, x, pos, NULL,
n_dims, mode, 32768, freq_base, 1, 0, 1, 0, 0)`` (no YaRN) on ggml-python's CPU backend, one
thread, and saves ``<name>`` = the float32 result ``(T, 1, d)``, ``positions`` and ``meta_json``
into ``--out`` (default ``tests/data/ggml_rope.npz``). The test regenerates ``x`` from the seed.

Rerun::

    $GGMLPY_REF_PYTHON scripts/make_rope_reference.py [--out tests/data/ggml_rope.npz]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

SEED = 20261202
POSITIONS = list(range(16)) + [100, 255, 511, 512, 1000, 1023, 2047, 4095, 5000, 8191, 10000,
                               16383, 20000, 30000, 32000, 32767]
#: name -> (mode, freq_base, d, n_dims)
CASES = {"neox_1e4": (2, 10000.0, 256, 256), "neox_1e6": (2, 1000000.0, 256, 256),
         "normal_1e4_partial": (0, 10000.0, 128, 64)}


def main() -> int:
    import ggml
    import ggml.utils

    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path,
                    default=Path(__file__).resolve().parents[1] / "tests/data/ggml_rope.npz")
    args = ap.parse_args()
    T = len(POSITIONS)
    out: dict[str, np.ndarray] = {"positions": np.asarray(POSITIONS, np.int32)}
    for k, (name, (mode, base, d, n_dims)) in enumerate(CASES.items()):
        ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=16 << 20, mem_buffer=None))
        a = ggml.ggml_new_tensor_3d(ctx, ggml.GGML_TYPE_F32, d, 1, T)
        pos = ggml.ggml_new_tensor_1d(ctx, ggml.GGML_TYPE_I32, T)
        r = ggml.ggml_rope_ext(ctx, a, pos, None, n_dims, mode, 32768, base, 1.0, 0.0, 1.0, 0.0,
                               0.0)
        gf = ggml.ggml_new_graph(ctx)
        ggml.ggml_build_forward_expand(gf, r)
        x = (np.random.default_rng(SEED + k).standard_normal((T, 1, d)) * 3).astype(np.float32)
        ggml.utils.to_numpy(a)[:] = x
        ggml.utils.to_numpy(pos)[:] = out["positions"]
        ggml.ggml_graph_compute_with_ctx(ctx, gf, 1)
        out[name] = ggml.utils.to_numpy(r).copy()
        ggml.ggml_free(ctx)
    meta = {"tool": "ggml-python", "ggml_python_version": getattr(ggml, "__version__", "?"),
            "op": "ggml_rope_ext(x, pos, NULL, n_dims, mode, 32768, freq_base, 1, 0, 1, 0, 0)",
            "cases": {n: dict(zip(("mode", "freq_base", "d", "n_dims"), c))
                      for n, c in CASES.items()},
            "x": "default_rng(seed + case index).standard_normal((T, 1, d)) * 3, float32",
            "seed": SEED, "script": "scripts/make_rope_reference.py"}
    out["meta_json"] = np.asarray(json.dumps(meta))
    np.savez_compressed(args.out, **out)
    print(f"{args.out}: {args.out.stat().st_size} bytes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
