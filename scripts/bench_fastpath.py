#!/usr/bin/env python3
"""Microbenchmark: the reference NumPy kernels vs :mod:`ggmlpy.backends.cpu.fastpath` (and numba when
importable) on MiniLM shapes; prints one JSON object.

Shapes (``--seqs`` 32 sequences x ``--tokens`` 36, hidden 384, 12 heads, ffn 1536): NORM on
``[T, 384]``, SOFT_MAX_EXT with a per-sequence key mask on ``[S, 12, L, L]``, bias + residual
ADDs on ``[T, 384]``, GELU_ERF on ``[T, 1536]``. The old kernels are compiled with
:func:`ggmlpy.backends.kernels.compile_node` from real graph nodes, exactly as the CPU backend
runs them. Each entry: best of ``--repeats`` timings of ``--number`` calls, in ms per call, and
the max abs difference from the old kernel's output.

Usage: ``python scripts/bench_fastpath.py [--seqs 32] [--tokens 36] [--repeats 7] [--number 20]``
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import timeit
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

try:
    import ggmlpy  # noqa: F401
except ImportError:  # running from a checkout without installing: use the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ggmlpy import ops  # noqa: E402
from ggmlpy.backends.cpu import fastpath  # noqa: E402
from ggmlpy.backends.kernels import compile_node  # noqa: E402
from ggmlpy.core.tensor import Context  # noqa: E402
from ggmlpy.core.types import Type  # noqa: E402


def _ms(fn: Callable[[], Any], repeats: int, number: int) -> float:
    return min(timeit.repeat(fn, repeat=repeats, number=number)) / number * 1e3


def _numba_kernels() -> dict[str, Callable[..., Any]] | None:
    try:
        import numba
    except ImportError:
        return None
    from ggmlpy.core.special import _AS_A, _AS_P

    a1, a2, a3, a4, a5 = (float(c) for c in _AS_A)
    p = float(_AS_P)

    @numba.njit(fastmath=False, cache=False, parallel=False)
    def nb_norm(x, eps, out):  # pragma: no cover - timed only
        rows, n = x.shape
        for r in range(rows):
            s = 0.0
            for i in range(n):
                s += x[r, i]
            mean = np.float32(s / n)
            v = 0.0
            for i in range(n):
                d = x[r, i] - mean
                out[r, i] = d
                v += d * d
            sc = np.float32(1.0 / math.sqrt(v / n + eps))
            for i in range(n):
                out[r, i] *= sc
        return out

    @numba.njit(fastmath=True)
    def nb_gelu(x, out):  # pragma: no cover - timed only
        xf = x.reshape(-1)
        of = out.reshape(-1)
        for i in range(xf.size):
            v = xf[i]
            a = min(abs(v), np.float32(30.0))
            t = np.float32(1.0) / (np.float32(1.0) + np.float32(p) * a)
            q = ((((np.float32(a5) * t + np.float32(a4)) * t + np.float32(a3)) * t
                  + np.float32(a2)) * t + np.float32(a1)) * t
            c = q * np.exp(np.float32(-0.5) * a * a)
            of[i] = max(v, np.float32(0.0)) - np.float32(0.5) * a * c
        return out

    return {"norm": nb_norm, "gelu": nb_gelu}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the microbenchmarks and print the JSON report; returns the exit status."""
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqs", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=36)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--number", type=int, default=20)
    args = ap.parse_args(argv)
    S, L, H, NH, F = args.seqs, args.tokens, 384, 12, 1536
    T = S * L
    rng = np.random.default_rng(0)
    rep, num = args.repeats, args.number
    report: dict[str, Any] = {"shapes": {"seqs": S, "tokens": L, "hidden": H, "heads": NH,
                                         "ffn": F}, "unit": "ms per call"}
    ctx = Context()

    def old_step(node: Any, srcs: list[np.ndarray]) -> tuple[Callable[[], Any], np.ndarray]:
        """The reference kernel's step on 4-D views (as the CPU backend binds them), and its
        output viewed in the shape of the first source."""
        dst = np.empty(tuple(node.ne[::-1]), dtype=np.float32)
        views = [a.reshape(tuple(t.ne[::-1])) for a, t in zip(srcs, node.src)]
        return compile_node(np, node, dst, views), dst.reshape(srcs[0].shape)

    # NORM [T, H]
    x = rng.standard_normal((T, H)).astype(np.float32) * 3 + 1
    tx = ctx.new_tensor_2d(Type.F32, H, T)
    n_node = ops.norm(ctx, tx, 1e-12)
    step, dst = old_step(n_node, [x])
    out = np.empty_like(x)
    step()
    fastpath.norm(np, x, 1e-12, out)
    r = {"old": _ms(step, rep, num), "new": _ms(lambda: fastpath.norm(np, x, 1e-12, out), rep, num),
         "max_abs_diff": float(np.abs(out - dst).max())}
    report["norm"] = r

    # SOFT_MAX_EXT [S, NH, L, L] with mask [S, 1, L_pad, L]
    kq = rng.standard_normal((S, NH, L, L)).astype(np.float32) * 4
    lens = rng.integers(3, L + 1, size=S)
    lens[0] = L
    mask = np.where(np.arange(L)[None, :] < lens[:, None], 0.0, -np.inf).astype(np.float32)
    L_pad = (L + 63) // 64 * 64
    mask4 = np.ascontiguousarray(np.broadcast_to(mask[:, None, None, :], (S, 1, L_pad, L)))
    tkq = ctx.new_tensor_4d(Type.F32, L, L, NH, S)
    tm = ctx.new_tensor_4d(Type.F32, L, L_pad, 1, S)
    sm_node = ops.soft_max_ext(ctx, tkq, tm, 0.125, 0.0)
    step, dst = old_step(sm_node, [kq, mask4])
    out = np.empty_like(kq)
    mview = mask4[:, :, :L, :]
    step()
    fastpath.soft_max(np, kq, mview, 0.125, out)
    report["soft_max"] = {"old": _ms(step, rep, num),
                          "new": _ms(lambda: fastpath.soft_max(np, kq, mview, 0.125, out), rep, num),
                          "max_abs_diff": float(np.abs(out - dst).max())}

    # bias + residual ADDs [T, H]
    y = rng.standard_normal((T, H)).astype(np.float32)
    b = rng.standard_normal(H).astype(np.float32)
    res = rng.standard_normal((T, H)).astype(np.float32)
    ty, tb, tr = (ctx.new_tensor_2d(Type.F32, H, T), ctx.new_tensor_1d(Type.F32, H),
                  ctx.new_tensor_2d(Type.F32, H, T))
    a1 = ops.add(ctx, ty, tb)
    a2 = ops.add(ctx, a1, tr)
    s1, d1 = old_step(a1, [y, b])
    s2, d2 = old_step(a2, [d1.reshape(y.shape), res])

    def old_adds() -> None:
        s1()
        s2()
    out = np.empty_like(y)
    old_adds()
    fastpath.add_bias_residual(np, y, b, res, out)
    report["add_bias_residual"] = {
        "old": _ms(old_adds, rep, num),
        "new": _ms(lambda: fastpath.add_bias_residual(np, y, b, res, out), rep, num),
        "max_abs_diff": float(np.abs(out - d2).max())}

    # GELU_ERF [T, F]
    g = (rng.standard_normal((T, F)) * 2).astype(np.float32)
    tg = ctx.new_tensor_2d(Type.F32, F, T)
    step, dst = old_step(ops.gelu_erf(ctx, tg), [g])
    out = np.empty_like(g)
    step()
    fastpath.gelu_erf(np, g, out)
    report["gelu_erf"] = {"old": _ms(step, rep, num),
                          "new": _ms(lambda: fastpath.gelu_erf(np, g, out), rep, num),
                          "max_abs_diff": float(np.abs(out - dst).max())}

    nb = _numba_kernels()
    if nb is None:
        report["numba"] = None
    else:
        o = np.empty_like(x)
        nb["norm"](x, 1e-12, o)
        report["norm"]["numba"] = _ms(lambda: nb["norm"](x, 1e-12, o), rep, num)
        report["norm"]["numba_max_abs_diff"] = float(np.abs(o - fastpath.norm(
            np, x, 1e-12, np.empty_like(x))).max())
        o = np.empty_like(g)
        nb["gelu"](g, o)
        report["gelu_erf"]["numba"] = _ms(lambda: nb["gelu"](g, o), rep, num)
        report["gelu_erf"]["numba_max_abs_diff"] = float(np.abs(o - dst).max())
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
