"""Case tables of the neural-network families: NORM, RMS_NORM, L2_NORM, GROUP_NORM, MUL_MAT,
OUT_PROD, DIAG_MASK_INF/ZERO, SOFT_MAX, ROPE, FLASH_ATTN_EXT."""

from __future__ import annotations

import math

import numpy as np

from ggmlpy import ops
from ggmlpy.core.tensor import Tensor
from ggmlpy.core.types import Type
from ggmlpy.testops.case import Builder, TestCase, init_ints, init_uniform
from ggmlpy.testops.cases_elementwise import strided_rows

__all__ = ["nn_cases", "mul_mat_flops", "out_prod_flops", "flash_attn_flops"]

F32, F16, I32 = Type.F32, Type.F16, Type.I32
MATMUL_NMSE = 5e-4  # ggml: MUL_MAT, OUT_PROD, FLASH_ATTN_EXT


def mul_mat_flops(out: Tensor) -> int:
    """``2*m*n*k*batch`` of a MUL_MAT node (ggml's ``op_flops``)."""
    return 2 * out.nelements * out.src[0].ne[0]


def out_prod_flops(out: Tensor) -> int:
    """``2 * nelements(out) * k`` of an OUT_PROD node (k = the shared ``a.ne1``)."""
    return 2 * out.nelements * out.src[0].ne[1]


def flash_attn_flops(out: Tensor) -> int:
    """``2*H*n_q*(Dk+Dv)*n_kv*B`` of a FLASH_ATTN_EXT node (ggml's ``op_flops``)."""
    q, k, v = out.src[0], out.src[1], out.src[2]
    return 2 * q.ne[2] * q.ne[1] * (q.ne[0] + v.ne[0]) * k.ne[1] * q.ne[3]


def _norm_cases() -> list[TestCase]:
    cases = []
    for name, fn, fn_i in (("NORM", ops.norm, ops.norm_inplace),
                           ("RMS_NORM", ops.rms_norm, ops.rms_norm_inplace),
                           ("L2_NORM", ops.l2_norm, ops.l2_norm_inplace)):
        rng = (-10.0, 10.0) if name == "RMS_NORM" else (-1.0, 1.0)
        for eps in (1e-6, 1e-4, 1e-1, 10.0):
            for n in (64, 1025, 33):
                for v in (0, 1, 2):
                    def build(b: Builder, fn=fn, n=n, v=v, eps=eps) -> Tensor:
                        if v == 1:
                            a = strided_rows(b, F32, [n, 5, 4, 3])
                        elif v == 2:  # permuted rows: dims 1 and 2 swapped
                            a = ops.permute(b.ctx, b.new(F32, [n, 4, 5, 3]), 0, 2, 1, 3)
                        else:
                            a = b.new(F32, [n, 5, 4, 3])
                        return fn(b.ctx, a, eps)
                    cases.append(TestCase(name, {"type": F32, "ne": [n, 5, 4, 3], "v": v,
                                                 "eps": eps}, build, init_range=rng))
        def build_i(b: Builder, fn_i=fn_i) -> Tensor:
            return fn_i(b.ctx, b.new(F32, [64, 5, 4, 3]), 1e-6)
        cases.append(TestCase(name, {"type": F32, "ne": [64, 5, 4, 3], "eps": 1e-6,
                                     "inplace": 1}, build_i, init_range=rng))
    for ne, groups in (([64, 64, 32, 1], 8), ([9, 9, 64, 1], 32), ([17, 3, 10, 2], 4)):
        def build_g(b: Builder, ne=ne, groups=groups) -> Tensor:
            return ops.group_norm(b.ctx, b.new(F32, ne), groups, 1e-6)
        cases.append(TestCase("GROUP_NORM", {"type": F32, "ne": ne, "num_groups": groups,
                                             "eps": 1e-6}, build_g))
    return cases


def _mm_case(ta: Type, tb: Type, m: int, n: int, k: int, bs: tuple[int, int] = (1, 1),
             nr: tuple[int, int] = (1, 1), per: tuple[int, ...] = (0, 1, 2, 3), k_v: int = 0,
             tags: frozenset[str] = frozenset()) -> TestCase:
    ne_a = [k, m, bs[0], bs[1]]
    ne_b = [k, n, bs[0] * nr[0], bs[1] * nr[1]]

    def mk(b: Builder, type: Type, ne: list[int], use_kv: bool) -> Tensor:
        if per != (0, 1, 2, 3):
            t = b.new(type, [ne[per[i]] for i in range(4)])
            return ops.permute(b.ctx, t, *per)
        if use_kv and k_v:
            t = b.new(type, [k_v, *ne[1:]])
            return ops.view_4d(b.ctx, t, *ne, t.nb[1], t.nb[2], t.nb[3], 0)
        return b.new(type, ne)

    def build(b: Builder) -> Tensor:
        return ops.mul_mat(b.ctx, mk(b, ta, ne_a, True), mk(b, tb, ne_b, True))
    return TestCase("MUL_MAT", {"type_a": ta, "type_b": tb, "m": m, "n": n, "k": k,
                                "bs": list(bs), "nr": list(nr), "per": list(per), "k_v": k_v},
                    build, max_nmse=MATMUL_NMSE, flops=mul_mat_flops, tags=tags)


def _matmul_cases() -> list[TestCase]:
    cases = []
    combos = ((F32, F32), (F16, F32), (F16, F16), (F32, F16))
    for ta, tb in combos:
        for n in range(1, 10):
            cases.append(_mm_case(ta, tb, 16, n, 256))
        for bs, nr in (((10, 1), (1, 1)), ((10, 1), (2, 1)), ((10, 10), (1, 1)),
                       ((10, 10), (2, 1)), ((10, 10), (1, 2)), ((10, 10), (2, 2)),
                       ((3, 2), (2, 3))):
            cases.append(_mm_case(ta, tb, 16, 16, 256, bs, nr))
        for per in ((0, 2, 1, 3), (0, 1, 3, 2), (0, 3, 2, 1)):
            cases.append(_mm_case(ta, tb, 16, 9, 128, (2, 3), (1, 1), per))
        for m, n, k in ((1, 1, 1), (16, 16, 65), (33, 5, 80), (1, 32, 256), (64, 45, 128)):
            cases.append(_mm_case(ta, tb, m, n, k))
        cases.append(_mm_case(ta, tb, 16, 8, 64, k_v=80))
        cases.append(_mm_case(ta, tb, 64, 32, 1056, tags=frozenset({"large"})))
    cases.append(_mm_case(F32, F32, 128, 64, 2880, tags=frozenset({"large"})))
    for ta in (F32, F16):
        for m, n, k in ((16, 16, 1), (16, 16, 16), (1, 16, 16), (16, 1, 16), (64, 32, 64)):
            for bs, nr in (((1, 1), (1, 1)), ((3, 2), (1, 1)), ((3, 2), (2, 1)), ((2, 2), (2, 2))):
                def build(b: Builder, ta=ta, m=m, n=n, k=k, bs=bs, nr=nr) -> Tensor:
                    a = b.new(ta, [m, k, bs[0], bs[1]])
                    bb = b.new(F32, [n, k, bs[0] * nr[0], bs[1] * nr[1]])
                    return ops.out_prod(b.ctx, a, bb)
                cases.append(TestCase("OUT_PROD", {"type_a": ta, "type_b": F32, "m": m, "n": n,
                                                   "k": k, "bs": list(bs), "nr": list(nr)},
                                      build, max_nmse=MATMUL_NMSE, flops=out_prod_flops))
    def build_ot(b: Builder) -> Tensor:  # transposed b (ggml's trans_b case)
        bb = ops.transpose(b.ctx, b.new(F32, [16, 32, 1, 1]))
        return ops.out_prod(b.ctx, b.new(F32, [24, 16, 1, 1]), bb)
    cases.append(TestCase("OUT_PROD", {"type_a": F32, "type_b": F32, "m": 24, "n": 32, "k": 16,
                                       "trans_b": 1}, build_ot, max_nmse=MATMUL_NMSE,
                          flops=out_prod_flops))
    return cases


def _softmax_cases() -> list[TestCase]:
    cases = []
    for name, fn, fn_i in (("DIAG_MASK_INF", ops.diag_mask_inf, ops.diag_mask_inf_inplace),
                           ("DIAG_MASK_ZERO", ops.diag_mask_zero, ops.diag_mask_zero_inplace)):
        for ne, n_past in (([10, 10, 1, 1], 5), ([10, 10, 3, 1], 5), ([10, 10, 3, 2], 5),
                           ([16, 8, 2, 1], 3), ([7, 9, 2, 2], 0)):
            for inplace in (0, 1):
                def build(b: Builder, f=(fn_i if inplace else fn), ne=ne, n_past=n_past):
                    return f(b.ctx, b.new(F32, ne), n_past)
                cases.append(TestCase(name, {"type": F32, "ne_a": ne, "n_past": n_past,
                                             "inplace": inplace}, build))
    for ne in ([16, 16, 1, 1], [15, 15, 3, 1], [1023, 4, 2, 3], [64, 9, 4, 2]):
        for mask in (0, 1):
            for m_prec in ((F32, F16) if mask else (F32,)):
                for max_bias in ((0.0, 8.0) if mask else (0.0,)):
                    for scale in (1.0, 0.1):
                        for nr23 in (((1, 1), (2, 1)) if mask and ne[2] % 2 == 0 else ((1, 1),)):
                            def build(b: Builder, ne=ne, mask=mask, m_prec=m_prec,
                                      max_bias=max_bias, scale=scale, nr23=nr23) -> Tensor:
                                a = b.new(F32, ne)
                                m = None
                                if mask:
                                    m = b.new(m_prec, [ne[0], ne[1] + 2, ne[2] // nr23[0],
                                                       ne[3] // nr23[1]])
                                return ops.soft_max_ext(b.ctx, a, m, scale, max_bias)
                            cases.append(TestCase("SOFT_MAX", {
                                "type": F32, "ne": ne, "mask": mask, "m_prec": m_prec,
                                "nr23": list(nr23), "scale": scale, "max_bias": max_bias,
                                "inplace": 0}, build, max_nmse=1e-6))
    def build_i(b: Builder) -> Tensor:
        return ops.soft_max_inplace(b.ctx, b.new(F32, [16, 16, 2, 1]))
    cases.append(TestCase("SOFT_MAX", {"type": F32, "ne": [16, 16, 2, 1], "mask": 0,
                                       "inplace": 1}, build_i, max_nmse=1e-6))
    def build_w(b: Builder) -> Tensor:
        return ops.soft_max(b.ctx, b.new(F32, [200001, 2, 1, 1]))
    cases.append(TestCase("SOFT_MAX", {"type": F32, "ne": [200001, 2, 1, 1], "mask": 0,
                                       "inplace": 0}, build_w, max_nmse=1e-6,
                          tags=frozenset({"large"})))
    return cases


def _rope_cases() -> list[TestCase]:
    cases = []
    shapes = (([128, 4, 3, 1], 128, 0), ([64, 8, 5, 1], 32, 512), ([80, 2, 7, 2], 64, 512))
    for ne, n_dims, n_ctx_orig in shapes:
        for mode in (0, 2):
            for type in (F32, F16):
                for fs in (1.0, 1.4245):
                    for ef in (0.0, 0.7465):
                        for af in (1.0, 1.4245):
                            for ff in (0, 1):
                                for v in (0, 1):
                                    if ne[3] > 1 and (v or type == F16):
                                        continue  # the batched shape: a smaller sweep
                                    cases.append(_rope_case(type, ne, n_dims, mode, n_ctx_orig,
                                                            fs, ef, af, ff, v, 0))
        cases.append(_rope_case(F32, ne, n_dims, 0, n_ctx_orig, 1.0, 0.0, 1.0, 0, 0, 1))
    return cases


def _rope_case(type: Type, ne: list[int], n_dims: int, mode: int, n_ctx_orig: int, fs: float,
               ef: float, af: float, ff: int, v: int, inplace: int) -> TestCase:
    def build(b: Builder) -> Tensor:
        if v:
            big = b.new(type, [ne[0] * 2, ne[1] * 4, ne[2] * 3, ne[3]])
            a = ops.view_4d(b.ctx, big, *ne, big.nb[1], big.nb[2], big.nb[3], 0)
        else:
            a = b.new(type, ne)
        pos = b.new(I32, [ne[2]], init=init_ints(0, 512))
        freq = b.new(F32, [n_dims // 2], init=init_uniform(0.9, 1.1)) if ff else None
        f = ops.rope_ext_inplace if inplace else ops.rope_ext
        return f(b.ctx, a, pos, freq, n_dims, mode, n_ctx_orig, 10000.0, fs, ef, af, 32.0, 1.0)
    return TestCase("ROPE", {"type": type, "ne_a": ne, "n_dims": n_dims, "mode": mode,
                             "n_ctx": 512, "fs": fs, "ef": ef, "af": af, "ff": ff, "v": v,
                             "inplace": inplace}, build)


def _fa_mask_init(rng: np.random.Generator, t: Tensor) -> np.ndarray:
    """U(-1, 1) with about 20% of 16-column blocks set to -inf (never the first block)."""
    x = rng.uniform(-1.0, 1.0, size=t.ne[::-1]).astype(np.float32)
    nblk = -(-t.ne[0] // 16)
    for idx in np.ndindex(*t.ne[:0:-1]):
        for j in range(1, nblk):
            if rng.random() < 0.2:
                x[idx][j * 16:(j + 1) * 16] = -np.inf
    return x.astype(t.type.dtype)


def _fa_case(hsk: int, hsv: int, nh: int, nr2: int, nr3: int, kv: int, nb: int, mask: int,
             max_bias: float, softcap: float, type_kv: Type, tags: frozenset[str] = frozenset()
             ) -> TestCase:
    def build(b: Builder) -> Tensor:
        q = b.new(F32, [hsk, nb, nh * nr2, nr3])
        k = b.new(type_kv, [hsk, kv, nh, nr3])
        v = b.new(type_kv, [hsv, kv, nh, nr3])
        m = b.new(F16, [kv, nb, 1, nr3], init=_fa_mask_init) if mask else None
        return ops.flash_attn_ext(b.ctx, q, k, v, m, 1.0 / math.sqrt(hsk), max_bias, softcap)
    return TestCase("FLASH_ATTN_EXT", {"hsk": hsk, "hsv": hsv, "nh": nh, "nr23": [nr2, nr3],
                                       "kv": kv, "nb": nb, "mask": mask, "max_bias": max_bias,
                                       "logit_softcap": softcap, "type_KV": type_kv},
                    build, max_nmse=MATMUL_NMSE, flops=flash_attn_flops, tags=tags)


def _fa_cases() -> list[TestCase]:
    cases = []
    for type_kv in (F32, F16):
        for hs in (40, 64, 128):
            for nh, nr2 in ((1, 1), (4, 1), (2, 4)):
                for kv in (113, 512):
                    for nb in (1, 8):
                        cases.append(_fa_case(hs, hs, nh, nr2, 1, kv, nb, 1, 0.0, 0.0, type_kv))
        cases.append(_fa_case(64, 64, 4, 1, 1, 113, 8, 0, 0.0, 0.0, type_kv))
        cases.append(_fa_case(64, 64, 4, 1, 1, 113, 8, 1, 8.0, 0.0, type_kv))
        cases.append(_fa_case(64, 64, 4, 1, 1, 113, 8, 1, 0.0, 10.0, type_kv))
        cases.append(_fa_case(64, 64, 4, 1, 3, 113, 3, 1, 0.0, 0.0, type_kv))
        cases.append(_fa_case(128, 64, 2, 2, 1, 256, 4, 1, 0.0, 0.0, type_kv))
        cases.append(_fa_case(128, 128, 8, 4, 1, 1024, 32, 1, 0.0, 0.0, type_kv,
                              frozenset({"large"})))
    return cases


def nn_cases() -> list[TestCase]:
    """Every normalisation, matrix, softmax, rope and attention case."""
    return _norm_cases() + _matmul_cases() + _softmax_cases() + _rope_cases() + _fa_cases()
