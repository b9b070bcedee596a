"""Neural-network ops (test-backend-ops family ``cases_nn``): norm/rms_norm/l2_norm/group_norm,
mul_mat/out_prod, diag_mask, soft_max, rope and flash_attn_ext.
"""

from __future__ import annotations

from collections.abc import Callable

from ggmlpy.core.check import checked_args
from ggmlpy.core.opcodes import Op
from ggmlpy.core.tensor import Context, Tensor
from ggmlpy.core.types import Type
from ggmlpy.ops._base import (
    ROPE_TYPE_NEOX,
    ROPE_TYPE_NORMAL,
    Prec,
    _args,
    _check_tensor,
    _desc,
    _divides,
    _dup_or_view,
    _f32,
    _int,
    _is_vector,
    _op,
    _require,
    _require_type,
)
from ggmlpy.ops._variants import inplace_variant, named_variant, shared_doc

__all__ = [
    "norm", "norm_inplace", "rms_norm", "rms_norm_inplace", "group_norm",
    "group_norm_inplace", "l2_norm", "l2_norm_inplace", "mul_mat", "mul_mat_set_prec",
    "out_prod", "diag_mask_inf", "diag_mask_inf_inplace", "diag_mask_zero",
    "diag_mask_zero_inplace", "soft_max", "soft_max_inplace", "soft_max_ext",
    "soft_max_ext_inplace", "rope", "rope_inplace", "rope_ext", "rope_ext_inplace",
    "flash_attn_ext", "flash_attn_ext_set_prec",
]


def _norm_impl(ctx: Context, a: Tensor, eps: float, op: Op, inplace: bool, fn: str) -> Tensor:
    _args(ctx, fn, a=a)
    e = _f32(eps, fn, "eps")
    if not e >= 0.0:
        raise ValueError(f"{fn}: requires eps >= 0, got {e} for {_desc(a)}")
    return _op(_dup_or_view(ctx, a, inplace), op, [e], [a])


def _norm_pair(name: str, op: Op, formula: str) -> tuple[Callable[..., Tensor],
                                                        Callable[..., Tensor]]:
    """``ggml_<name>(ctx, a, eps)`` (per-row ``formula``) and its generated in-place twin."""

    def norm_fn(ctx: Context, a: Tensor, eps: float) -> Tensor:
        return _norm_impl(ctx, a, eps, op, False, name)

    base = named_variant(norm_fn, name, (
        f"{formula}, op {op.name} (mirrors ``ggml_{name}``).\n\n"
        "a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``, rows along axis -1). Result: "
        "a's type and ne, src ``[a]``, op_params ``[eps]`` (float). Raises ValueError if "
        "``eps < 0``.\n"))
    return base, inplace_variant(base, _norm_impl, op=op)


norm, norm_inplace = _norm_pair("norm", Op.NORM, "Per-row standardisation ``(x - mean) / "
                                "sqrt(var + eps)`` (population variance)")
rms_norm, rms_norm_inplace = _norm_pair("rms_norm", Op.RMS_NORM,
                                        "Per-row ``x / sqrt(mean(x**2) + eps)``")
l2_norm, l2_norm_inplace = _norm_pair("l2_norm", Op.L2_NORM, "Per-row ``x / max(||x||_2, eps)``")


def _group_norm_impl(ctx: Context, a: Tensor, n_groups: int, eps: float, inplace: bool,
                     fn: str) -> Tensor:
    _args(ctx, fn, a=a)
    g, e = _int(n_groups, fn, "n_groups"), _f32(eps, fn, "eps")
    if g < 1 or not e >= 0.0:
        raise ValueError(f"{fn}: requires n_groups >= 1 and eps >= 0, got n_groups={g}, eps={e} "
                         f"for {_desc(a)}")
    return _op(_dup_or_view(ctx, a, inplace), Op.GROUP_NORM, [g, e], [a])


@checked_args
def group_norm(ctx: Context, a: Tensor, n_groups: int, eps: float) -> Tensor:
    """Group normalisation over channels = **dim 2**, op GROUP_NORM (mirrors ``ggml_group_norm``).

    a ``[W, H, C, N]`` (NumPy ``(N, C, H, W)``). With ``cpg = ceil(C / n_groups)``
    each group of channels ``[g*cpg, min((g+1)*cpg, C))`` and each n is normalised over its
    ``W*H*channels`` values (mean, population variance, ``+ eps``). Result: a's type and ne, src
    ``[a]``, op_params ``[n_groups, eps]`` (int, float). Raises ValueError if ``n_groups < 1`` or
    ``eps < 0``.
    """
    return _group_norm_impl(ctx, a, n_groups, eps, False, "group_norm")


group_norm_inplace = inplace_variant(group_norm, _group_norm_impl)


@checked_args
def mul_mat(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Batched ``b @ a.T`` over rows of K values, op MUL_MAT (mirrors ``ggml_mul_mat``).

    a ``[K, M, A2, A3]`` (NumPy ``(A3, A2, M, K)``; any type incl. quantized; not transposed), b
    ``[K, N, B2, B3]`` (NumPy ``(B3, B2, N, K)``) with ``B2 % A2 == 0`` and ``B3 % A3 == 0``.
    Result: **F32** ``[M, N, B2, B3]`` (NumPy ``(B3, B2, N, M)``): ``out[i, j, k, l] = dot(a[:, i, k
    // (B2/A2), l // (B3/A3)], b[:, j, k, l])`` (block-repeat broadcast of a, not tiling). src ``[a,
    b]``, op_params ``[prec, hint]`` = ``[Prec.DEFAULT, 0]`` (see :func:`mul_mat_set_prec`). Raises
    ValueError if ``a.ne0 != b.ne0``, the batch dims do not divide, or a is transposed (``nb0 >
    nb1``).
    """
    fn = "mul_mat"
    _args(ctx, fn, a=a, b=b)
    _require_batched_pair(fn, a, b, k_dim=0)
    result = ctx.new_tensor(Type.F32, (a.ne[1], b.ne[1], b.ne[2], b.ne[3]))
    return _op(result, Op.MUL_MAT, [int(Prec.DEFAULT), 0], [a, b])


def _require_batched_pair(fn: str, a: Tensor, b: Tensor, k_dim: int) -> None:
    """The shape rules MUL_MAT and OUT_PROD share: the shared K in dimension ``k_dim`` of both,
    a's batch dims 2 and 3 dividing b's (block-repeat broadcast), a not transposed."""
    _require(a.ne[k_dim] == b.ne[k_dim], fn, f"a.ne{k_dim} == b.ne{k_dim} (shared K)", a, b)
    _require(_divides(a.ne[2], b.ne[2]), fn, "b.ne2 % a.ne2 == 0", a, b)
    _require(_divides(a.ne[3], b.ne[3]), fn, "b.ne3 % a.ne3 == 0", a, b)
    _require(not a.is_transposed(), fn, "a not transposed (a.nb0 <= a.nb1)", a)


def _set_prec(a: Tensor, prec: Prec | int, op: Op, slot: int, fn: str) -> Tensor:
    """Store precision hint ``prec`` in op_params[slot] of ``a``, an ``op`` node; returns a."""
    _check_tensor(a, fn, "a")
    p = _int(prec, fn, "prec")
    _require(a.op == op, fn, f"a to be a {op.name} node", a)
    if p not in (Prec.DEFAULT, Prec.F32):
        raise ValueError(f"{fn}: prec must be Prec.DEFAULT (0) or Prec.F32 (10), got {p}")
    a.op_params[slot] = int(p)
    return a


@checked_args
def mul_mat_set_prec(a: Tensor, prec: Prec | int) -> Tensor:
    """Set a MUL_MAT node's accumulation-precision hint ``op_params[0]`` (mirrors
    ``ggml_mul_mat_set_prec``).

    ``prec`` is :class:`Prec` (DEFAULT 0, F32 10); a hint to the backend (the result is F32
    either way).
    Returns ``a``. Raises ValueError if a's op is not MUL_MAT or prec is unknown, TypeError if a is
    not a Tensor.
    """
    return _set_prec(a, prec, Op.MUL_MAT, 0, "mul_mat_set_prec")


@checked_args
def out_prod(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Batched outer-product sum over the shared dim 1, op OUT_PROD (mirrors ``ggml_out_prod``).

    a ``[M, K, A2, A3]`` (NumPy ``(A3, A2, K, M)``; not transposed), b ``[N, K, B2, B3]`` with
    ``B2 % A2 == 0``, ``B3 % A3 == 0``. Result: **F32** ``[M, N, B2, B3]`` (NumPy
    ``(B3, B2, N, M)`` = ``b.swapaxes(-1, -2) @ A`` with a block-repeated), ``out[i0, i1, i2, i3] =
    sum_k a[i0, k, i2 // r2, i3 // r3] * b[i1, k, i2, i3]``. src ``[a, b]``, no params. Raises
    ValueError if ``a.ne1 != b.ne1``, the batch dims do not divide, or a is transposed.
    """
    fn = "out_prod"
    _args(ctx, fn, a=a, b=b)
    _require_batched_pair(fn, a, b, k_dim=1)
    result = ctx.new_tensor(Type.F32, (a.ne[0], b.ne[0], b.ne[2], b.ne[3]))
    return _op(result, Op.OUT_PROD, [], [a, b])


def _diag_mask_impl(ctx: Context, a: Tensor, n_past: int, op: Op, inplace: bool,
                    fn: str) -> Tensor:
    _args(ctx, fn, a=a)
    n = _int(n_past, fn, "n_past")
    return _op(_dup_or_view(ctx, a, inplace), op, [n], [a])


@checked_args
def diag_mask_inf(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    """Causal mask: element (col i0, row i1) of every 2-D slice becomes -inf where ``i0 > n_past +
    i1``, op DIAG_MASK_INF (mirrors ``ggml_diag_mask_inf``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``). Result: a's type
    and ne, src ``[a]``, op_params ``[n_past]`` (int). No shape rules.
    """
    return _diag_mask_impl(ctx, a, n_past, Op.DIAG_MASK_INF, False, "diag_mask_inf")


diag_mask_inf_inplace = inplace_variant(diag_mask_inf, _diag_mask_impl, op=Op.DIAG_MASK_INF)


@checked_args
def diag_mask_zero(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    """Like :func:`diag_mask_inf` but sets the masked elements to 0, op DIAG_MASK_ZERO (mirrors
    ``ggml_diag_mask_zero``).

    a ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``), F32. Result: a's type and ne,
    src ``[a]``, op_params ``[n_past]`` (int). No shape rules.
    """
    return _diag_mask_impl(ctx, a, n_past, Op.DIAG_MASK_ZERO, False, "diag_mask_zero")


diag_mask_zero_inplace = inplace_variant(diag_mask_zero, _diag_mask_impl, op=Op.DIAG_MASK_ZERO)


def _require_mask(fn: str, mask: Tensor, x: Tensor, x_name: str, n_kv: int, n_kv_name: str,
                  n_kv_src: Tensor, n_q_note: str) -> None:
    """ggml's checks of a soft_max / flash_attn_ext ``mask``: F16/F32, contiguous, ``ne0 == n_kv``
    (``n_kv_name``, read from ``n_kv_src``), at least as many rows as ``x`` (named ``x_name``; its
    rows ``n_q_note``) and ``ne2``/``ne3`` broadcast over x's. Raises ValueError/TypeError naming
    ``fn`` and the tensors."""
    _require_type(mask.type in (Type.F16, Type.F32), fn, "mask of type F16 or F32", mask)
    _require(mask.is_contiguous(), fn, "mask to be contiguous", mask)
    _require(mask.ne[0] == n_kv, fn, f"mask.ne0 == {n_kv_name}", n_kv_src, mask)
    _require(mask.ne[1] >= x.ne[1], fn, f"mask.ne1 >= {x_name}.ne1{n_q_note}", x, mask)
    _require(_divides(mask.ne[2], x.ne[2]), fn, f"{x_name}.ne2 % mask.ne2 == 0", x, mask)
    _require(_divides(mask.ne[3], x.ne[3]), fn, f"{x_name}.ne3 % mask.ne3 == 0", x, mask)


def _soft_max_impl(ctx: Context, a: Tensor, mask: Tensor | None, scale: float, max_bias: float,
                   inplace: bool, fn: str) -> Tensor:
    _args(ctx, fn, a=a, mask=mask)
    s, mb = _f32(scale, fn, "scale"), _f32(max_bias, fn, "max_bias")
    _require(a.is_contiguous(), fn, "a to be contiguous", a)
    if mask is not None:
        _require_mask(fn, mask, a, "a", a.ne[0], "a.ne0", a, "")
    if mb > 0.0:
        _require(mask is not None, fn, "a mask when max_bias > 0 (ALiBi)", a)
    return _op(_dup_or_view(ctx, a, inplace), Op.SOFT_MAX, [s, mb], [a, mask])


#: shape, param and error rules shared by the docstrings below
_SOFT_MAX_RULES = """
a contiguous ``[ne0, ne1, ne2, ne3]`` (NumPy ``(ne3, ne2, ne1, ne0)``); softmax
runs along rows (NumPy axis -1) of ``scale*x + slope(h)*mask_row``. Optional mask F16/F32,
contiguous, ``mask.ne0 == a.ne0``, ``mask.ne1 >= a.ne1`` (row i of a uses mask row i), tiled
over dims 2/3 (``a.ne2 % mask.ne2 == 0``, ``a.ne3 % mask.ne3 == 0``). ``max_bias > 0`` (ALiBi
slopes per dim-2 head) requires a mask. Result: a's type and ne,
src ``[a, mask]`` (mask slot None when absent), op_params ``[scale, max_bias]`` (floats). Raises
ValueError for the shape/layout rules, TypeError for a mask of another type.
"""


@shared_doc(_SOFT_MAX_RULES)
@checked_args
def soft_max(ctx: Context, a: Tensor) -> Tensor:
    """Row softmax, op SOFT_MAX, params ``[1.0, 0.0]`` (mirrors ``ggml_soft_max``)."""
    return _soft_max_impl(ctx, a, None, 1.0, 0.0, False, "soft_max")


soft_max_inplace = inplace_variant(soft_max, _soft_max_impl, mask=None, scale=1.0, max_bias=0.0)


@shared_doc(_SOFT_MAX_RULES)
@checked_args
def soft_max_ext(ctx: Context, a: Tensor, mask: Tensor | None, scale: float,
                 max_bias: float) -> Tensor:
    """Row softmax of ``scale*a + slope*mask``, op SOFT_MAX (mirrors ``ggml_soft_max_ext``)."""
    return _soft_max_impl(ctx, a, mask, scale, max_bias, False, "soft_max_ext")


soft_max_ext_inplace = inplace_variant(soft_max_ext, _soft_max_impl)


#: what :func:`rope` passes for the arguments of :func:`rope_ext` it does not take (ggml_rope's)
_ROPE_DEFAULTS: dict[str, object] = dict(freq_factors=None, n_ctx_orig=0, freq_base=10000.0,
                                         freq_scale=1.0, ext_factor=0.0, attn_factor=1.0,
                                         beta_fast=0.0, beta_slow=0.0)


def _rope_impl(ctx: Context, a: Tensor, pos: Tensor, freq_factors: Tensor | None, n_dims: int,
               mode: int, n_ctx_orig: int, freq_base: float, freq_scale: float,
               ext_factor: float, attn_factor: float, beta_fast: float, beta_slow: float,
               inplace: bool, fn: str) -> Tensor:
    _args(ctx, fn, a=a, pos=pos, freq_factors=freq_factors)
    nd, md = _int(n_dims, fn, "n_dims"), _int(mode, fn, "mode")
    nco = _int(n_ctx_orig, fn, "n_ctx_orig")
    floats = [_f32(v, fn, n) for v, n in ((freq_base, "freq_base"), (freq_scale, "freq_scale"),
                                          (ext_factor, "ext_factor"), (attn_factor, "attn_factor"),
                                          (beta_fast, "beta_fast"), (beta_slow, "beta_slow"))]
    if md & 1:
        raise ValueError(f"{fn}: mode & 1 is no longer supported by ggml (got mode={md}) for "
                         f"{_desc(a)}")
    if md not in (ROPE_TYPE_NORMAL, ROPE_TYPE_NEOX):
        raise ValueError(f"{fn}: ggmlpy supports mode ROPE_TYPE_NORMAL (0) and ROPE_TYPE_NEOX (2) "
                         f"only, got mode={md} for {_desc(a)}")
    if nd < 0 or nd % 2 or nd > a.ne[0]:
        raise ValueError(f"{fn}: requires n_dims even and 0 <= n_dims <= a.ne0, got n_dims={nd} "
                         f"for {_desc(a)}")
    _require_type(pos.type == Type.I32, fn, "pos of type I32", pos)
    _require(_is_vector(pos), fn, "pos to be a vector", pos)
    _require(pos.ne[0] == a.ne[2], fn, "pos.ne0 == a.ne2 (one position per token)", a, pos)
    if freq_factors is not None:
        _require_type(freq_factors.type == Type.F32, fn, "freq_factors of type F32", freq_factors)
        _require(freq_factors.ne[0] >= nd // 2, fn, f"freq_factors.ne0 >= n_dims/2 = {nd // 2}",
                 freq_factors)
    params = [0, nd, md, 0, nco, *floats, 0, 0, 0, 0, 0]
    return _op(_dup_or_view(ctx, a, inplace), Op.ROPE, params, [a, pos, freq_factors])


#: shape, param and error rules shared by the docstrings below
_ROPE_RULES = """
a ``[head_dim, n_head, n_tok, B]`` (NumPy ``(B, n_tok, n_head, head_dim)``); pos
**I32** vector ``[n_tok]`` (``pos.ne0 == a.ne2``); optional freq_factors **F32** with ``ne0 >=
n_dims/2``. ``n_dims`` (even, ``<= a.ne0``) leading elements of each row rotate: mode
``ROPE_TYPE_NORMAL`` (0) pairs ``(2m, 2m+1)``, ``ROPE_TYPE_NEOX`` (2) pairs ``(m, m+n_dims/2)``.
Result: a's type and ne, src ``[a, pos, freq_factors]`` (None
when absent), op_params (16 slots) ``[0, n_dims, mode, 0, n_ctx_orig, freq_base, freq_scale,
ext_factor, attn_factor, beta_fast, beta_slow, 0, 0, 0, 0, 0]`` (slots 5-10 floats, 11-14 M-RoPE
sections, 15 n_offs). Raises ValueError for ``mode & 1``, modes other than NORMAL/NEOX
(M-RoPE/vision are not implemented), a bad n_dims or shapes; TypeError for pos not I32 or
freq_factors not F32.
"""


@shared_doc(_ROPE_RULES)
@checked_args
def rope(ctx: Context, a: Tensor, pos: Tensor, n_dims: int, mode: int) -> Tensor:
    """Rotary position embedding with ggml's default settings, op ROPE (mirrors ``ggml_rope``).

    Defaults: n_ctx_orig 0, freq_base 10000, freq_scale 1, ext_factor 0, attn_factor 1,
    beta_fast 0, beta_slow 0 (no YaRN), no freq_factors.
    """
    return _rope_impl(ctx, a, pos, n_dims=n_dims, mode=mode, **_ROPE_DEFAULTS, inplace=False,
                      fn="rope")


rope_inplace = inplace_variant(rope, _rope_impl, **_ROPE_DEFAULTS)


@shared_doc(_ROPE_RULES)
@checked_args
def rope_ext(ctx: Context, a: Tensor, pos: Tensor, freq_factors: Tensor | None, n_dims: int,
             mode: int, n_ctx_orig: int, freq_base: float, freq_scale: float, ext_factor: float,
             attn_factor: float, beta_fast: float, beta_slow: float) -> Tensor:
    """Rotary position embedding with YaRN parameters, op ROPE (mirrors ``ggml_rope_ext``)."""
    return _rope_impl(ctx, a, pos, freq_factors, n_dims, mode, n_ctx_orig, freq_base, freq_scale,
                      ext_factor, attn_factor, beta_fast, beta_slow, False, "rope_ext")


rope_ext_inplace = inplace_variant(rope_ext, _rope_impl)


@checked_args
def flash_attn_ext(ctx: Context, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
                   scale: float, max_bias: float, logit_softcap: float) -> Tensor:
    """Fused attention ``softmax(scale * q k^T [softcap] + slope*mask) v``, op FLASH_ATTN_EXT
    (mirrors ``ggml_flash_attn_ext``).

    q ``[Dk, n_q, H, B]`` (NumPy ``(B, H, n_q, Dk)``, F32), k ``[Dk, n_kv, H_kv, B]``, v ``[Dv,
    n_kv, H_kv, B]`` (not transposed; K/V heads are block-repeated: q head h uses kv head ``h // (H
    / H_kv)``), optional mask F16 (F32 accepted) contiguous ``[n_kv, >= n_q, H_m, B_m]`` tiled over
    heads/batch. Result: **F32, permuted** ``[Dv, H, n_q, B]`` (NumPy ``(B, n_q, H, Dv)``), src
    ``[q, k, v, mask]`` (mask None when absent), op_params ``[scale, max_bias, logit_softcap,
    prec]`` (3 floats, int prec = ``Prec.DEFAULT``; see :func:`flash_attn_ext_set_prec`). Raises
    ValueError unless ``k.ne0 == q.ne0``, ``v.ne1 == k.ne1``, ``q.ne2 % k.ne2 == 0``, ``q.ne2 %
    v.ne2 == 0``, ``q.ne3 == k.ne3 == v.ne3``; for the mask ``mask.ne0 == k.ne1``, ``mask.ne1 >=
    q.ne1``, ``q.ne2 % mask.ne2 == 0``, ``q.ne3 % mask.ne3 == 0``; and a mask when ``max_bias > 0``.
    TypeError for a mask that is not F16/F32.
    """
    fn = "flash_attn_ext"
    _args(ctx, fn, q=q, k=k, v=v, mask=mask)
    params = [_f32(scale, fn, "scale"), _f32(max_bias, fn, "max_bias"),
              _f32(logit_softcap, fn, "logit_softcap"), int(Prec.DEFAULT)]
    _require(k.ne[0] == q.ne[0], fn, "k.ne0 == q.ne0 (head size Dk)", q, k)
    _require(_divides(k.ne[2], q.ne[2]), fn, "q.ne2 % k.ne2 == 0 (GQA heads)", q, k)
    _require(q.ne[3] == k.ne[3], fn, "q.ne3 == k.ne3", q, k)
    _require(q.ne[3] == v.ne[3], fn, "q.ne3 == v.ne3", q, v)
    _require(v.ne[1] == k.ne[1], fn, "v.ne1 == k.ne1 (n_kv)", k, v)
    _require(_divides(v.ne[2], q.ne[2]), fn, "q.ne2 % v.ne2 == 0 (GQA heads)", q, v)
    if mask is not None:
        _require_mask(fn, mask, q, "q", k.ne[1], "k.ne1 (n_kv)", k, " (n_q)")
    if params[1] > 0.0:
        _require(mask is not None, fn, "a mask when max_bias > 0 (ALiBi)", q)
    result = ctx.new_tensor(Type.F32, (v.ne[0], q.ne[2], q.ne[1], q.ne[3]))
    return _op(result, Op.FLASH_ATTN_EXT, params, [q, k, v, mask])


@checked_args
def flash_attn_ext_set_prec(a: Tensor, prec: Prec | int) -> Tensor:
    """Set a FLASH_ATTN_EXT node's precision hint ``op_params[3]`` (mirrors
    ``ggml_flash_attn_ext_set_prec``).

    ``prec`` is :class:`Prec` (DEFAULT 0, F32 10). Returns ``a``. Raises ValueError if a's op is not
    FLASH_ATTN_EXT or prec is unknown, TypeError if a is not a Tensor.
    """
    return _set_prec(a, prec, Op.FLASH_ATTN_EXT, 3, "flash_attn_ext_set_prec")
