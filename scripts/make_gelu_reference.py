"""Write ggml-cpu's GELU / GEGLU outputs for every f16 input, for the CPU's f16-table variant.

Reference tool only: it runs under the reference venv (ggml-python, named by $GGMLPY_REF_PYTHON;
see tests/data/README.md), never under ggmlpy's, and ggmlpy never imports it.

ggml-cpu computes float32 GELU and GEGLU through a table of 65536 f16 entries (vec.h,
``GGML_GELU_FP16``). This script runs ``ggml_gelu`` on an F32 tensor holding every finite f16
value (the bit patterns 0..65535 widened to float32; NaN and infinities replaced by 0) and
``ggml_geglu_split`` of the same values with seeded normal gates, one thread, on ggml-python's
CPU backend, and saves (``--out``, default ``tests/data/ggml_gelu_f16.npz``):

- ``gelu``: float16 ``(65536,)`` ggml's GELU of the input made from bit pattern ``i`` (each value
  is an f16 table entry, or ``x``/0 outside ``(-10, 10)``, so float16 holds it exactly);
- ``gate``: float32 ``(4096,)`` and ``geglu``: float32 ``(4096,)`` the GEGLU of ``x[::16]``;
- ``meta_json``: tool, version, settings.

Rerun::

    $GGMLPY_REF_PYTHON scripts/make_gelu_reference.py [--out tests/data/ggml_gelu_f16.npz]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

GATE_SEED = 20261202


def main() -> int:
    import ggml
    import ggml.utils

    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path,
                    default=Path(__file__).resolve().parents[1] / "tests/data/ggml_gelu_f16.npz")
    args = ap.parse_args()
    n = 1 << 16
    ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=16 << 20, mem_buffer=None))
    x = ggml.ggml_new_tensor_1d(ctx, ggml.GGML_TYPE_F32, n)
    xs16 = ggml.ggml_new_tensor_1d(ctx, ggml.GGML_TYPE_F32, n // 16)
    g = ggml.ggml_new_tensor_1d(ctx, ggml.GGML_TYPE_F32, n // 16)
    y = ggml.ggml_gelu(ctx, x)
    z = ggml.ggml_geglu_split(ctx, xs16, g)
    gf = ggml.ggml_new_graph(ctx)
    ggml.ggml_build_forward_expand(gf, y)
    ggml.ggml_build_forward_expand(gf, z)
    xv = np.arange(n, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    xv[~np.isfinite(xv)] = 0.0
    gate = np.random.default_rng(GATE_SEED).standard_normal(n // 16).astype(np.float32)
    ggml.utils.to_numpy(x)[:] = xv
    ggml.utils.to_numpy(xs16)[:] = xv[::16]
    ggml.utils.to_numpy(g)[:] = gate
    ggml.ggml_graph_compute_with_ctx(ctx, gf, 1)
    gelu = ggml.utils.to_numpy(y).copy()
    if not np.array_equal(gelu.astype(np.float16).astype(np.float32), gelu):
        raise RuntimeError("ggml's GELU gave values that are not f16: no table in this build?")
    geglu = ggml.utils.to_numpy(z).copy()
    ggml.ggml_free(ctx)
    meta = {"tool": "ggml-python", "ggml_python_version": getattr(ggml, "__version__", "?"),
            "ops": "ggml_gelu(x), ggml_geglu_split(x[::16], gate) on the CPU, 1 thread",
            "gate_seed": GATE_SEED, "script": "scripts/make_gelu_reference.py"}
    np.savez_compressed(args.out, gelu=gelu.astype(np.float16), gate=gate, geglu=geglu,
                        meta_json=np.asarray(json.dumps(meta)))
    print(f"{args.out}: {args.out.stat().st_size} bytes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
