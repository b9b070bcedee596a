"""Case tables of the layout and reduction families: DUP, CONT, CPY, REPEAT, CONCAT, SET, ACC,
GET_ROWS, SET_ROWS, PAD, ARANGE, TIMESTEP_EMBEDDING, SUM, SUM_ROWS, MEAN, ARGMAX, ARGSORT."""

from __future__ import annotations

import numpy as np

from ggmlpy import ops
from ggmlpy.core.tensor import Tensor
from ggmlpy.core.types import Type
from ggmlpy.testops.case import Builder, TestCase, init_ints, init_uniform, init_unique_rows

__all__ = ["layout_cases", "init_row_ids", "set_rows_case"]

F32, F16, I32, I64 = Type.F32, Type.F16, Type.I32, Type.I64

_PERMS = ([0, 1, 2, 3], [0, 2, 1, 3], [1, 0, 2, 3], [2, 1, 0, 3], [1, 2, 0, 3])


def _copy_cases() -> list[TestCase]:
    cases = []
    pairs = [(F32, F32), (F32, F16), (F16, F32), (F16, F16), (F32, I32), (I32, F32), (I32, I32)]
    for ts, td in pairs:
        thr = 0.0 if ts == td else 1e-6
        for ne in ([256, 4, 4, 4], [7, 3, 5, 2]):
            for perm in _PERMS[:4]:
                def build(b: Builder, ts=ts, td=td, ne=ne, perm=perm) -> Tensor:
                    a = b.new(ts, ne)
                    if perm != [0, 1, 2, 3]:
                        a = ops.permute(b.ctx, a, *perm)
                    return ops.cpy(b.ctx, a, b.new(td, a.ne))
                cases.append(TestCase("CPY", {"type_src": ts, "type_dst": td, "ne": ne,
                                              "permute_src": perm},
                                      build, max_nmse=thr, init_range=(-150.0, 150.0)))
        # strided destination (a transposed view of the destination tensor)
        def build_d(b: Builder, ts=ts, td=td) -> Tensor:
            a = b.new(ts, [8, 6, 3, 1])
            dst = ops.transpose(b.ctx, b.new(td, [6, 8, 3, 1]))
            return ops.cpy(b.ctx, a, dst)
        cases.append(TestCase("CPY", {"type_src": ts, "type_dst": td, "ne": [8, 6, 3, 1],
                                      "_dst_transpose": 1}, build_d, max_nmse=thr,
                              init_range=(-150.0, 150.0)))
        # reshaping copy: same element count, different shape
        def build_r(b: Builder, ts=ts, td=td) -> Tensor:
            return ops.cpy(b.ctx, b.new(ts, [12, 5, 2, 1]), b.new(td, [30, 4, 1, 1]))
        cases.append(TestCase("CPY", {"type_src": ts, "type_dst": td, "ne": [12, 5, 2, 1],
                                      "ne_dst": [30, 4, 1, 1]}, build_r, max_nmse=thr,
                              init_range=(-150.0, 150.0)))
    for type in (F32, F16, I32):
        for perm in _PERMS:
            def build(b: Builder, type=type, perm=perm) -> Tensor:
                a = b.new(type, [10, 10, 20, 1])
                if perm != [0, 1, 2, 3]:
                    a = ops.permute(b.ctx, a, *perm)
                return ops.dup(b.ctx, a)
            cases.append(TestCase("DUP", {"type": type, "ne": [10, 10, 20, 1], "permute": perm},
                                  build, max_nmse=0.0))
    for type in (F32, F16, I32):
        for ne in ([10, 10, 10, 1], [2, 1, 1, 1], [7, 13, 5, 3]):
            for kind in ("transpose", "slice", "permute"):
                def build(b: Builder, type=type, ne=ne, kind=kind) -> Tensor:
                    a = b.new(type, ne)
                    if kind == "transpose":
                        a = ops.transpose(b.ctx, a)
                    elif kind == "slice":  # every other row of a, as a strided view
                        a = ops.view_4d(b.ctx, a, ne[0], max(1, ne[1] // 2), ne[2], ne[3],
                                        a.nb[1] * 2 if ne[1] > 1 else a.nb[1], a.nb[2], a.nb[3], 0)
                    else:
                        a = ops.permute(b.ctx, a, 1, 2, 0, 3)
                    return ops.cont(b.ctx, a)
                cases.append(TestCase("CONT", {"type": type, "ne": ne, "kind": kind}, build,
                                      max_nmse=0.0))
    return cases


def _repeat_concat_cases() -> list[TestCase]:
    cases = []
    for type in (F32, F16, I32):
        for ne3 in (1, 3):
            ne = [10, 5, 4, ne3]
            for nr in ([1, 1, 1, 1], [2, 1, 1, 1], [1, 2, 1, 1], [1, 1, 2, 1], [1, 1, 1, 2],
                       [2, 2, 2, 2]):
                def build(b: Builder, type=type, ne=ne, nr=nr) -> Tensor:
                    a = b.new(type, ne)
                    return ops.repeat_4d(b.ctx, a, *[n * r for n, r in zip(ne, nr)])
                cases.append(TestCase("REPEAT", {"type": type, "ne": ne, "nr": nr}, build,
                                      max_nmse=0.0))
    for type in (F32, F16, I32):
        for dim in range(4):
            for v in range(4):
                ne_a = [11, 12, 13, 14]
                ne_b = list(ne_a)
                ne_b[dim] = 7

                def build(b: Builder, type=type, dim=dim, v=v, ne_a=ne_a, ne_b=ne_b) -> Tensor:
                    def mk(ne: list[int], view: bool) -> Tensor:
                        if not view:
                            return b.new(type, ne)
                        t = b.new(type, [ne[0] * 2, *ne[1:]])  # packed elements, strided rows
                        return ops.view_4d(b.ctx, t, *ne, t.nb[1], t.nb[2], t.nb[3], 0)
                    return ops.concat(b.ctx, mk(ne_a, bool(v & 1)), mk(ne_b, bool(v & 2)), dim)
                cases.append(TestCase("CONCAT", {"type": type, "ne_a": ne_a, "ne_b_d": 7,
                                                 "dim": dim, "v": v}, build, max_nmse=0.0))
    return cases


def _set_acc_cases() -> list[TestCase]:
    cases = []
    for type in (F32, I32):
        for dim in (1, 2, 3):
            for inplace in (0, 1):
                ne = [6, 5, 4, 3]

                def build(b: Builder, type=type, dim=dim, inplace=inplace, ne=ne) -> Tensor:
                    a = b.new(type, ne)
                    ne_b = list(ne)
                    ne_b[dim] = 1  # one slice along dim, written at index 1
                    src = b.new(type, ne_b)
                    off = a.nb[dim] * 1
                    f = ops.set_inplace if inplace else ops.set
                    return f(b.ctx, a, src, a.nb[1], a.nb[2], a.nb[3], off)
                cases.append(TestCase("SET", {"type_src": type, "type_dst": type, "ne": ne,
                                              "dim": dim, "inplace": inplace}, build,
                                      max_nmse=0.0))
    for ne_b, off in (([256, 17, 1, 1], 0), ([128, 16, 2, 3], 64), ([255, 5, 1, 3], 4),
                      ([1, 17, 2, 3], 100), ([256, 1, 2, 1], 1024), ([16, 8, 2, 3], 8)):
        for inplace in (0,) if off else (0, 1):
            def build(b: Builder, ne_b=ne_b, off=off, inplace=inplace) -> Tensor:
                a = b.new(F32, [256, 17, 2, 3])
                src = b.new(F32, ne_b)
                f = ops.acc_inplace if inplace else ops.acc
                return f(b.ctx, a, src, a.nb[1], a.nb[2], a.nb[3], off * 4)
            cases.append(TestCase("ACC", {"type": F32, "ne_a": [256, 17, 2, 3], "ne_b": ne_b,
                                          "offset": off, "inplace": inplace}, build))
    return cases


def _get_rows_cases() -> list[TestCase]:
    cases = []
    for type in (F32, F16, I32):
        for n, m, r in ((10, 5, 3), (256, 40, 17)):
            for be1, be2 in ((1, 1), (3, 2)):
                for v in (0, 1):
                    def build(b: Builder, type=type, n=n, m=m, r=r, be1=be1, be2=be2, v=v):
                        a = b.new(type, [n, m, be1, be2])
                        idx = b.new(I32, [r * (2 if v else 1), be1, be2], init=init_ints(0, m))
                        if v:  # the first r of 2r indices per row: a view with strided rows
                            idx = ops.view_3d(b.ctx, idx, r, be1, be2, idx.nb[1], idx.nb[2], 0)
                        return ops.get_rows(b.ctx, a, idx)
                    cases.append(TestCase("GET_ROWS", {"type": type, "n": n, "m": m, "r": r,
                                                       "be1": be1, "be2": be2, "v": v}, build,
                                          max_nmse=0.0))
    return cases


def init_row_ids(n_rows: int):
    """Index initialiser for SET_ROWS: each index row (``ne0`` values) starts with a random
    permutation of ``0..n_rows-1`` (repeated when ``ne0 > n_rows``), so the first ``n_rows``
    indices of a row never name a destination row twice (ggml leaves that undefined; its
    test-backend-ops draws distinct rows the same way)."""
    def init(rng: np.random.Generator, t: Tensor) -> np.ndarray:
        rows = [np.resize(rng.permutation(n_rows), t.ne[0]) for _ in range(t.nrows)]
        return np.stack(rows).astype(t.type.dtype).reshape(t.ne[::-1])
    return init


def set_rows_case(type: Type, type_idx: Type, ne: list[int], nr23: tuple[int, int], r: int,
                  v: int, max_nmse: float = 0.0) -> TestCase:
    """ggml's ``test_set_rows``: destination ``[ne0, ne1, ne2*nr23[0], ne3*nr23[1]]`` of
    ``type``, ``r`` F32 source rows per (i2, i3), indices ``[r, ne2, ne3]`` of ``type_idx``
    broadcast over ``nr23``; ``v`` takes the indices as a strided view (the first ``r`` of
    ``2r`` per row)."""
    def build(b: Builder) -> Tensor:
        ne2, ne3 = ne[2] * nr23[0], ne[3] * nr23[1]
        a = b.new(type, [ne[0], ne[1], ne2, ne3])
        src = b.new(F32, [ne[0], r, ne2, ne3])
        n_idx = 2 * r if v else r
        idx = b.new(type_idx, [n_idx, ne[2], ne[3]], init=init_row_ids(ne[1]))
        if v:
            idx = ops.view_3d(b.ctx, idx, r, ne[2], ne[3], idx.nb[1], idx.nb[2], 0)
        return ops.set_rows(b.ctx, a, src, idx)
    return TestCase("SET_ROWS", {"type": type, "type_idx": type_idx, "ne": ne,
                                 "nr23": list(nr23), "r": r, "v": v}, build, max_nmse=max_nmse)


def _set_rows_cases() -> list[TestCase]:
    cases = []
    for type in (F32, F16):
        for type_idx in (I64, I32):
            for ne, nr23, r in (([256, 5, 1, 3], (1, 1), 1), ([256, 11, 1, 1], (2, 3), 7),
                                ([3, 7, 1, 1], (1, 1), 2), ([31, 3, 3, 1], (2, 3), 2)):
                for v in (0, 1):
                    cases.append(set_rows_case(type, type_idx, ne, nr23, r, v,
                                               0.0 if type == F32 else 1e-7))
    return cases


def _misc_cases() -> list[TestCase]:
    cases = []
    for ne, p in (([512, 34, 2, 1], [1, 1, 0, 0]), ([11, 22, 33, 4], [1, 2, 3, 4]),
                  ([3, 1, 7, 2], [0, 5, 0, 1])):
        def build(b: Builder, ne=ne, p=p) -> Tensor:
            return ops.pad(b.ctx, b.new(F32, ne), *p)
        cases.append(TestCase("PAD", {"type": F32, "ne_a": ne, "pad": p}, build, max_nmse=0.0))
    for lp, rp in (([1, 0, 2, 0], [0, 3, 0, 1]), ([2, 2, 2, 2], [2, 2, 2, 2]),
                   ([0, 1, 0, 0], [5, 0, 0, 0])):
        def build_e(b: Builder, lp=lp, rp=rp) -> Tensor:
            a = b.new(F32, [9, 8, 7, 2])
            return ops.pad_ext(b.ctx, a, lp[0], rp[0], lp[1], rp[1], lp[2], rp[2], lp[3], rp[3])
        cases.append(TestCase("PAD", {"type": F32, "ne_a": [9, 8, 7, 2], "lp": lp, "rp": rp},
                              build_e, max_nmse=0.0))
    def build_pt(b: Builder) -> Tensor:
        return ops.pad(b.ctx, ops.transpose(b.ctx, b.new(F32, [8, 9, 3, 1])), 2, 1, 0, 0)
    cases.append(TestCase("PAD", {"type": F32, "ne_a": [9, 8, 3, 1], "transposed": 1},
                          build_pt, max_nmse=0.0))
    for start, stop, step in ((0.0, 10.0, 1.0), (-5.0, 30.0, 0.25), (3.0, 1000.0, 7.5)):
        def build_a(b: Builder, start=start, stop=stop, step=step) -> Tensor:
            return ops.arange(b.ctx, start, stop, step)
        cases.append(TestCase("ARANGE", {"type": F32, "start": start, "stop": stop,
                                         "step": step}, build_a))
    for n, dim, max_period in ((12, 128, 10000), (3, 31, 100), (64, 320, 10000)):
        def build_t(b: Builder, n=n, dim=dim, max_period=max_period) -> Tensor:
            t = b.new(F32, [n], init=init_uniform(0.0, 1000.0))
            return ops.timestep_embedding(b.ctx, t, dim, max_period)
        cases.append(TestCase("TIMESTEP_EMBEDDING", {"type": F32, "ne_a": [n, 1, 1, 1],
                                                     "dim": dim, "max_period": max_period},
                              build_t))
    return cases


def _reduce_cases() -> list[TestCase]:
    cases = []
    shapes = ([10, 5, 4, 3], [33, 1, 1, 1], [1024, 8, 2, 1], [32769, 1, 1, 1])
    for name, fn in (("SUM", ops.sum), ("SUM_ROWS", ops.sum_rows), ("MEAN", ops.mean)):
        types = (F32, F16) if name != "MEAN" else (F32,)
        for type in types:
            for ne in shapes:
                def build(b: Builder, fn=fn, type=type, ne=ne) -> Tensor:
                    return fn(b.ctx, b.new(type, ne))
                cases.append(TestCase(name, {"type": type, "ne": ne}, build,
                                      init_range=(-0.9, 1.1)))
            for perm in ([0, 2, 1, 3], [1, 0, 2, 3]):
                def build_p(b: Builder, fn=fn, type=type, perm=perm) -> Tensor:
                    return fn(b.ctx, ops.permute(b.ctx, b.new(type, [10, 5, 4, 3]), *perm))
                cases.append(TestCase(name, {"type": type, "ne": [10, 5, 4, 3], "permute": perm},
                                      build_p, init_range=(-0.9, 1.1)))
    for ne in ([32, 1, 1, 1], [100, 10, 1, 1], [1024, 12, 1, 1], [2000, 10, 1, 1], [5, 513, 1, 1]):
        def build_m(b: Builder, ne=ne) -> Tensor:
            return ops.argmax(b.ctx, b.new(F32, ne, init=init_unique_rows(0.01)))
        cases.append(TestCase("ARGMAX", {"type": F32, "ne": ne}, build_m, max_nmse=0.0))
    for order in (ops.SortOrder.ASC, ops.SortOrder.DESC):
        for ne in ([3, 1, 1, 1], [8, 4, 1, 1], [16, 10, 10, 10], [60, 10, 10, 1], [1023, 2, 1, 3],
                   [1024, 2, 1, 1], [4097, 3, 1, 1]):
            def build_s(b: Builder, ne=ne, order=order) -> Tensor:
                return ops.argsort(b.ctx, b.new(F32, ne, init=init_unique_rows(0.5)), order)
            cases.append(TestCase("ARGSORT", {"type": F32, "ne": ne,
                                              "order": order.value}, build_s, max_nmse=0.0))
    return cases


def layout_cases() -> list[TestCase]:
    """Every layout, index and reduction case."""
    return (_copy_cases() + _repeat_concat_cases() + _set_acc_cases() + _get_rows_cases()
            + _set_rows_cases() + _misc_cases() + _reduce_cases())
