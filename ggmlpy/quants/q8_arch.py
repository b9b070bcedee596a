"""ggml-cpu's per-architecture activation quantizers for Q8_0 and Q8_1, and which one a host runs.

ggml's CPU backend does not quantize ``src1`` of a MUL_MAT with the reference quantizers of
:mod:`ggmlpy.quants.q8` on every machine: ``quantize_row_q8_0`` and ``quantize_row_q8_1`` have
their own SIMD forms per architecture (ggml-cpu/arch/*/quants.c; arch-fallback.h maps an arch
without one to the reference loop of ggml-cpu/quants.c). Their blocks agree with the reference
on most inputs and differ on ties and extreme scales, which moves a model's logits by a few
float32 ulps. Forms (:data:`FORMS`):

``"x86"`` -- ggml-cpu/arch/x86/quants.c, the ``__AVX__ || __AVX2__`` branch (every x86-64
    build with AVX, so also AVX-512 ones): ``amax`` by ``maxps`` over four 8-lane vectors then
    a horizontal ``maxps`` tree, ``d = amax / 127`` (stored f16), ``id = 127 / amax`` (0 when
    ``amax`` is 0; not ``1 / d``), ``q = round(x * id)`` to nearest *even*
    (``_mm256_round_ps(_MM_ROUND_NEAREST)``), converted by ``cvtps2dq`` (NaN and
    ``|v| >= 2**31`` give ``0x80000000``) and packed to int8 with signed saturation (that
    ``0x80000000`` becomes -128). Q8_1: ``s = f16(d * float(sum))`` with ``sum`` the int32
    (wrapping) sum of the 32 converted values before the saturating packs.
``"arm"`` -- ggml-cpu/arch/arm/quants.c, the ``__ARM_NEON`` branch (every aarch64 build):
    ``amax`` by NaN-propagating ``vmaxq_f32``/``vmaxvq_f32``, ``d = amax / 127``, ``id = 1 / d``
    (0 when ``d`` is 0), ``q`` by ``vcvtnq_s32_f32`` (to nearest even, saturating to int32, NaN
    to 0) and stored to ``int8_t`` as its low byte. Q8_1: ``s = f16(d * float(sum))``, ``sum``
    the int32 (wrapping) sum of the converted values.
``"ref"`` -- ggml-quants.c ``quantize_row_q8_0_ref``/``_q8_1_ref`` (:mod:`ggmlpy.quants.q8`),
    which every other arch (and a ``GGML_CPU_GENERIC`` build) runs.

Q8_K has no SIMD quantizer on x86 or arm (both ``quantize_row_q8_K`` call
``quantize_row_q8_K_ref``), so every form quantizes it as :func:`ggmlpy.quants.q8.quantize_row_q8_K`.

Where the forms differ (a block with ``amax`` the scale, ``x / d`` the scaled value): a tie
``x / d = k + 0.5`` rounds away from zero in ``"ref"`` and to the even neighbour in ``"x86"`` and
``"arm"``; ``"x86"``'s ``127 / amax`` differs from ``1 / (amax / 127)`` by an ulp for some
``amax``, which moves values near a half-way point; a block whose ``127 / amax`` or ``1 / d``
overflows (``amax`` below ~3.7e-37: its f16 ``d`` is 0 anyway) gets quants -128 (``"x86"``) or
-1 / 0 (``"arm"``, the low bytes of the saturated ``+-2**31``) where ``"ref"`` writes 0;
non-finite input: ``"x86"`` gives the element -128 and keeps the block's scale from the lanes the
``maxps`` order lets through (a NaN in lanes 0..7 can be dropped), ``"arm"`` gives the block a NaN
(or inf) scale and 0 quants, ``"ref"`` a NaN scale and 0 quants (see :mod:`ggmlpy.quants.q8`).
f16 conversion of ``d`` and ``s``: round to nearest even (F16C ``vcvtps2ph``, ARM ``fcvt``), a
quiet NaN keeping its top payload bits as NumPy's conversion does.
"""

from __future__ import annotations

import platform

import numpy as np

from ggmlpy.core import env
from ggmlpy.quants import q8
from ggmlpy.quants._common import F32

__all__ = ["FORMS", "FORM_CODE", "host_form", "env_form", "quantize_row_q8_0_x86", "quantize_row_q8_1_x86",
           "quantize_row_q8_0_arm", "quantize_row_q8_1_arm", "quantize_row_q8"]

#: the quantizer forms: ggml's reference loop, ggml-cpu's x86 AVX/AVX2 one, its aarch64 NEON one
FORMS = ("ref", "x86", "arm")
#: each form's integer code, as the compiled CPU quantizers take it
FORM_CODE = {"ref": 0, "x86": 1, "arm": 2}
_X86 = ("x86_64", "amd64", "i386", "i686", "x86")
_ARM = ("aarch64", "arm64", "armv8l", "armv8b")
_INT32_MIN = np.int32(-2**31)


def host_form(machine: str | None = None) -> str:
    """The form ggml-cpu runs on ``machine`` (default :func:`platform.machine`): ``"x86"`` for
    x86-64/x86 (ggml's x86 quantizer needs AVX, which every x86-64 CPU ggml's builds target has),
    ``"arm"`` for aarch64 (NEON is part of the ISA), ``"ref"`` for any other machine (ggml's
    other arches: their ``quantize_row_q8_0`` SIMD forms are not modelled here)."""
    m = (platform.machine() if machine is None else machine).lower()
    if m in _X86:
        return "x86"
    if m in _ARM:
        return "arm"
    return "ref"


def env_form() -> str:
    """The form ``GGMLPY_Q8_ROUNDING`` selects (:func:`ggmlpy.core.env.q8_rounding`): ``native``
    (the default) resolves to :func:`host_form`; ``ref``/``x86``/``arm`` are returned as given.

    Raises:
        ggmlpy.core.env.EnvError: the variable holds another value.
    """
    v = env.q8_rounding()
    return host_form() if v == "native" else v


def _maxps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """x86 ``maxps`` lane by lane: ``a > b ? a : b`` (a NaN in either operand gives ``b``)."""
    with np.errstate(invalid="ignore"):
        return np.where(a > b, a, b)


def _amax_x86(ab: np.ndarray) -> np.ndarray:
    """``amax`` of every block of ``|x|`` ``(nb, 32)`` in the order of the AVX loop: four 8-lane
    vectors folded left to right, then the 128-bit halves (high, low), then ``movehl`` and
    ``movehdup`` steps; returns float32 ``(nb,)``."""
    m = ab[:, 0:8]
    for j in (8, 16, 24):
        m = _maxps(m, ab[:, j:j + 8])
    m4 = _maxps(m[:, 4:8], m[:, 0:4])
    m2 = _maxps(m4[:, 0:2], m4[:, 2:4])
    return _maxps(m2[:, 0], m2[:, 1])


def _cvt_x86(v: np.ndarray) -> np.ndarray:
    """``cvtps2dq`` of float32 values already rounded to integers: int32, ``0x80000000`` for NaN
    and for values outside int32's range."""
    with np.errstate(invalid="ignore"):
        ok = np.abs(v) < F32(2.0**31)
        return np.where(ok, v, F32(0)).astype(np.int32) | np.where(ok, 0, _INT32_MIN)


def _cvtn_arm(v: np.ndarray) -> np.ndarray:
    """``vcvtnq_s32_f32``: to nearest even, saturated to int32, NaN to 0."""
    with np.errstate(invalid="ignore"):
        r = np.rint(v)
        big = r >= F32(2.0**31)
        small = r < F32(-2.0**31)
        nan = np.isnan(r)
        out = np.where(big | small | nan, F32(0), r).astype(np.int32)
    out[big] = np.int32(2**31 - 1)
    out[small] = _INT32_MIN
    return out


def _q8_x86(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float32 ``d``, int8 ``qs`` and the int32 converted values of float32 blocks ``b``."""
    amax = _amax_x86(np.abs(b))
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        d = (amax / F32(127)).astype(F32, copy=False)
        nz = amax != 0
        idv = np.where(nz, F32(127) / np.where(nz, amax, F32(1)), F32(0)).astype(F32, copy=False)
        v = np.rint((b * idv[:, None]).astype(F32, copy=False))
    iv = _cvt_x86(v)
    return d, np.clip(iv, -128, 127).astype(np.int8), iv


def _q8_arm(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ab = np.abs(b)
    with np.errstate(invalid="ignore"):
        amax = np.max(ab, axis=1)                       # NaN-propagating, as vmaxq/vmaxvq
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        d = (amax / F32(127)).astype(F32, copy=False)
        nz = d != 0                                     # NaN counts as true, as in C
        idv = np.where(nz, F32(1) / np.where(nz, d, F32(1)), F32(0)).astype(F32, copy=False)
        v = (b * idv[:, None]).astype(F32, copy=False)
    iv = _cvtn_arm(v)
    return d, iv.astype(np.int8), iv                   # int32 -> int8_t keeps the low byte


def _pack(d: np.ndarray, qs: np.ndarray, iv: np.ndarray, lead: tuple[int, ...],
          with_s: bool) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        d16 = d.astype(np.float16)
        if not with_s:
            out = np.empty((d.shape[0], q8.Q8_0_BYTES), np.uint8)
            out[:, 0:2] = d16.view(np.uint8).reshape(-1, 2)
            out[:, 2:] = qs.view(np.uint8)
            return out.reshape(*lead, -1)
        s = iv.sum(axis=1, dtype=np.int32)              # wraps as int32 adds do
        s16 = (d * s.astype(F32)).astype(F32, copy=False).astype(np.float16)
    out = np.empty((d.shape[0], q8.Q8_1_BYTES), np.uint8)
    out[:, 0:2] = d16.view(np.uint8).reshape(-1, 2)
    out[:, 2:4] = s16.view(np.uint8).reshape(-1, 2)
    out[:, 4:] = qs.view(np.uint8)
    return out.reshape(*lead, -1)


def _blocks(x: np.ndarray, fn: str) -> tuple[np.ndarray, tuple[int, ...]]:
    return q8._blocks(x, q8.QK8_0, fn)


def quantize_row_q8_0_x86(x: np.ndarray) -> np.ndarray:
    """Rows of float32 to Q8_0 blocks as ggml-cpu's x86 ``quantize_row_q8_0`` writes them
    (ggml-cpu/arch/x86/quants.c, AVX/AVX2 branch; see the module doc for the rounding).

    Args:
        x: float array, NumPy shape ``(..., ne0)`` (ggml ``ne = [ne0, ...]``), ``ne0`` a multiple
            of 32; converted to float32 first.

    Returns:
        uint8 ``(..., ne0 // 32 * 34)``: each row's blocks in ggml's layout. Synchronous.

    Raises:
        TypeError: ``x`` is not numeric. ValueError: 0-d, or ``ne0`` not a multiple of 32.
    """
    b, lead = _blocks(x, "quantize_row_q8_0_x86")
    d, qs, iv = _q8_x86(b)
    return _pack(d, qs, iv, lead, False)


def quantize_row_q8_1_x86(x: np.ndarray) -> np.ndarray:
    """Rows of float32 to Q8_1 blocks as ggml-cpu's x86 ``quantize_row_q8_1`` writes them: as
    :func:`quantize_row_q8_0_x86` plus ``s = f16(d * float(sum))`` (int32 sum of the converted
    values). ``x`` float ``(..., ne0)``, ``ne0`` a multiple of 32; returns uint8
    ``(..., ne0 // 32 * 36)``. Synchronous.

    Raises:
        TypeError: ``x`` is not numeric. ValueError: 0-d, or ``ne0`` not a multiple of 32.
    """
    b, lead = _blocks(x, "quantize_row_q8_1_x86")
    d, qs, iv = _q8_x86(b)
    return _pack(d, qs, iv, lead, True)


def quantize_row_q8_0_arm(x: np.ndarray) -> np.ndarray:
    """Rows of float32 to Q8_0 blocks as ggml-cpu's aarch64 ``quantize_row_q8_0`` writes them
    (ggml-cpu/arch/arm/quants.c, NEON branch). ``x`` float ``(..., ne0)``, ``ne0`` a multiple of
    32; returns uint8 ``(..., ne0 // 32 * 34)``. Synchronous.

    Raises:
        TypeError: ``x`` is not numeric. ValueError: 0-d, or ``ne0`` not a multiple of 32.
    """
    b, lead = _blocks(x, "quantize_row_q8_0_arm")
    d, qs, iv = _q8_arm(b)
    return _pack(d, qs, iv, lead, False)


def quantize_row_q8_1_arm(x: np.ndarray) -> np.ndarray:
    """Rows of float32 to Q8_1 blocks as ggml-cpu's aarch64 ``quantize_row_q8_1`` writes them.
    ``x`` float ``(..., ne0)``, ``ne0`` a multiple of 32; returns uint8 ``(..., ne0 // 32 * 36)``.
    Synchronous.

    Raises:
        TypeError: ``x`` is not numeric. ValueError: 0-d, or ``ne0`` not a multiple of 32.
    """
    b, lead = _blocks(x, "quantize_row_q8_1_arm")
    d, qs, iv = _q8_arm(b)
    return _pack(d, qs, iv, lead, True)


_FNS = {("q8_0", "ref"): q8.quantize_row_q8_0, ("q8_1", "ref"): q8.quantize_row_q8_1,
        ("q8_0", "x86"): quantize_row_q8_0_x86, ("q8_1", "x86"): quantize_row_q8_1_x86,
        ("q8_0", "arm"): quantize_row_q8_0_arm, ("q8_1", "arm"): quantize_row_q8_1_arm}


def quantize_row_q8(kind: str, x: np.ndarray, form: str) -> np.ndarray:
    """``x`` ``(..., ne0)`` quantized to ``kind`` (``"q8_0"``, ``"q8_1"``, ``"q8_K"``) in ``form``
    (one of :data:`FORMS`; Q8_K is the reference in every form). Returns the uint8 blocks
    ``(..., q8_row_bytes(kind, ne0))``. Synchronous.

    Raises:
        ValueError: unknown ``kind`` or ``form``; ``ne0`` not whole blocks. TypeError: ``x`` is
            not numeric.
    """
    if form not in FORMS:
        raise ValueError(f"quantize_row_q8: form must be one of {FORMS}, got {form!r}")
    if kind == "q8_K":
        return q8.quantize_row_q8_K(x)
    fn = _FNS.get((kind, form))
    if fn is None:
        raise ValueError(f"quantize_row_q8: kind must be q8_0, q8_1 or q8_K, got {kind!r}")
    return fn(x)
