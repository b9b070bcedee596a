"""Output forms of ``python -m ggmlpy embed``: llama.cpp's ``--embd-normalize`` and
``--embd-output-format``, and JSON that stays valid when a row holds NaN or infinity.

:func:`embd_normalize` mirrors llama.cpp's ``common_embd_normalize`` (``common/common.cpp``);
:func:`format_llama` mirrors what ``llama-embedding`` prints for ``--embd-output-format
array|json|json+`` (``examples/embedding/embedding.cpp``): a JSON array of arrays, an
OpenAI-style list object, and that object with the cosine-similarity matrix added.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["embd_normalize", "json_rows", "cosine_matrix", "format_llama", "nonfinite_rows",
           "OUTPUT_FORMATS"]

#: ``--embd-output-format`` values.
OUTPUT_FORMATS = ("array", "json", "json+")


def embd_normalize(x: np.ndarray, norm: int) -> np.ndarray:
    """Each row of ``x`` (float ``[n, dim]``, NumPy shape) scaled as llama.cpp's
    ``common_embd_normalize(inp, out, n, embd_norm)``: ``-1`` none; ``0`` max-abs scaled to
    the int16 range (the largest magnitude becomes 32760; values stay float); ``2``
    euclidean (L2, llama.cpp's default); any other ``p >= 1`` the p-norm (``1`` taxicab). A
    row whose norm is 0 becomes 0. Sums in float64; returns float32 ``[n, dim]``.

    Raises:
        ValueError: ``norm < -1``.
    """
    if isinstance(norm, bool) or not isinstance(norm, int) or norm < -1:
        raise ValueError(f"embd_normalize: norm must be an int >= -1, got {norm!r}")
    v = np.asarray(x, np.float64)
    if norm == -1:
        s = np.ones(v.shape[:-1] + (1,))
    elif norm == 0:
        s = np.abs(v).max(axis=-1, keepdims=True) / 32760.0
    elif norm == 2:
        s = np.sqrt((v * v).sum(axis=-1, keepdims=True))
    else:
        s = (np.abs(v) ** norm).sum(axis=-1, keepdims=True) ** (1.0 / norm)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(s > 0, 1.0 / s, 0.0)
    return (v * scale).astype(np.float32)


def nonfinite_rows(x: np.ndarray) -> list[int]:
    """Indices of the rows of ``x`` (``[n, dim]``) holding a NaN or an infinity."""
    x = np.asarray(x)
    if x.size == 0:
        return []
    return [int(i) for i in np.flatnonzero(~np.isfinite(x).all(axis=-1))]


def json_rows(x: np.ndarray) -> list[list[float | None]]:
    """``x`` (``[n, dim]``) as nested lists of Python floats, every NaN/inf as None (JSON
    ``null``), so that ``json.dumps(..., allow_nan=False)`` succeeds."""
    x = np.asarray(x, np.float64)
    if np.isfinite(x).all():
        return x.tolist()
    return [[float(v) if np.isfinite(v) else None for v in row] for row in x]


def cosine_matrix(x: np.ndarray) -> np.ndarray:
    """Cosine similarity of every pair of rows of ``x`` (``[n, dim]``), float64 ``[n, n]``;
    a zero row has similarity 0 with everything (as llama.cpp's ``common_embd_similarity_cos``),
    a row holding NaN/inf has NaN with everything."""
    v = np.asarray(x, np.float64)
    n = np.linalg.norm(v, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        u = np.where(n[:, None] == 0, 0.0, v / n[:, None])
        return u @ u.T


def format_llama(x: np.ndarray, fmt: str, indices: Sequence[int] | None = None) -> str:
    """The text ``llama-embedding --embd-output-format fmt`` prints for the rows of ``x``
    (``[n, dim]``): ``"array"`` ``[[...], ...]``; ``"json"`` ``{"object": "list", "data":
    [{"object": "embedding", "index": i, "embedding": [...]}, ...]}``; ``"json+"`` adds
    ``"cosineSimilarity"`` (``[n, n]``). NaN/inf become ``null``.

    Raises:
        ValueError: ``fmt`` is not one of :data:`OUTPUT_FORMATS`.
    """
    if fmt not in OUTPUT_FORMATS:
        raise ValueError(f"format_llama: fmt must be one of {', '.join(OUTPUT_FORMATS)}, got {fmt!r}")
    rows = json_rows(x)
    if fmt == "array":
        return json.dumps(rows, allow_nan=False)
    idx = list(range(len(rows))) if indices is None else list(indices)
    out: dict[str, Any] = {"object": "list", "data": [
        {"object": "embedding", "index": i, "embedding": r} for i, r in zip(idx, rows)]}
    if fmt == "json+":
        out["cosineSimilarity"] = json_rows(cosine_matrix(x))
    return json.dumps(out, allow_nan=False, indent=2)
