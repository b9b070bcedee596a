"""Token sampling over a logits vector, as llama.cpp's common sampler chain does it.

llama.cpp's ``common_sampler`` (common/sampling.cpp) chains the samplers of llama-sampler.cpp; with
its default settings and DRY / XTC / typical-p / top-n-sigma / mirostat off the chain is::

    penalties -> top-k -> top-p -> min-p -> temperature -> dist

:class:`Sampler` runs that chain on NumPy arrays. Each stage is a function over a
:class:`Candidates` set (ids + float32 logits, in an order, with a "sorted" flag), as llama.cpp's
``llama_token_data_array``. Where llama.cpp leaves an order unspecified (``std::partial_sort``
among equal logits) this module sorts stably: equal logits keep increasing id order. ``dist``
draws with a Mersenne Twister seeded like ``std::mt19937(seed)`` and one
``std::uniform_real_distribution<double>`` number per draw (two 32-bit outputs, as libstdc++'s
``generate_canonical<double, 53>``), then takes the first candidate whose running probability sum
reaches that fraction of the total (``llama_sampler_dist_apply``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["SamplerParams", "Sampler", "Candidates", "apply_penalties", "apply_top_k", "apply_top_p",
           "apply_min_p", "apply_temperature", "softmax", "greedy", "MT19937"]


@dataclass(frozen=True)
class SamplerParams:
    """Sampling settings (the fields of llama.cpp's ``common_params_sampling`` this chain uses;
    defaults are llama.cpp's).

    Attributes:
        temp: temperature; ``<= 0`` samples greedily (the largest penalised logit).
        top_k: keep the ``top_k`` largest logits; ``<= 0`` keeps all.
        top_p: keep the smallest most-probable prefix whose probability sum is ``>= top_p``;
            ``>= 1`` keeps all.
        min_p: keep tokens whose probability is ``>= min_p`` times the largest; ``<= 0`` keeps all.
        repeat_penalty: divide (positive) / multiply (negative) the logits of tokens seen in the
            last ``repeat_last_n`` tokens; 1 = off.
        repeat_last_n: how many of the latest history tokens the penalties look at; 0 = off,
            -1 = the whole history.
        frequency_penalty: subtract ``count * frequency_penalty`` from a seen token's logit.
        presence_penalty: subtract ``presence_penalty`` from a seen token's logit.
        min_keep: top-p / min-p keep at least this many tokens.
        seed: RNG seed (an unsigned 32-bit value); None draws one from the OS (llama.cpp's
            ``LLAMA_DEFAULT_SEED``).
    """

    temp: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    min_keep: int = 0
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("temp", "top_p", "min_p", "repeat_penalty", "frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
                raise ValueError(f"SamplerParams.{name} must be a real number, got {value!r}")
        for name in ("top_k", "repeat_last_n", "min_keep"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"SamplerParams.{name} must be an int, got {type(value).__name__}")
        if self.repeat_penalty <= 0:
            raise ValueError(f"SamplerParams.repeat_penalty must be > 0, got {self.repeat_penalty}")
        if self.repeat_last_n < -1:
            raise ValueError(f"SamplerParams.repeat_last_n must be >= -1, got {self.repeat_last_n}")
        if self.min_keep < 0:
            raise ValueError(f"SamplerParams.min_keep must be >= 0, got {self.min_keep}")
        if self.seed is not None and not 0 <= int(self.seed) <= 0xFFFFFFFF:
            raise ValueError(f"SamplerParams.seed must be in [0, 2**32), got {self.seed}")


@dataclass
class Candidates:
    """The tokens still in play: ``ids`` int64 [n] and their ``logits`` float32 [n], in the
    current order; ``sorted`` when the order is by descending logit (llama_token_data_array)."""

    ids: np.ndarray
    logits: np.ndarray
    sorted: bool = False

    @classmethod
    def from_logits(cls, logits: np.ndarray) -> Candidates:
        """All ``n_vocab`` tokens of a float logits vector [n_vocab] (copied to float32).

        Raises:
            ValueError: ``logits`` is not 1-d, is empty, holds NaN, or has no finite value above -inf.
        """
        a = np.asarray(logits)
        if a.ndim != 1 or a.shape[0] == 0:
            raise ValueError(f"logits: expected a non-empty 1-d vector [n_vocab], got shape {a.shape}")
        if not np.issubdtype(a.dtype, np.floating):
            raise ValueError(f"logits: expected a float vector, got dtype {a.dtype}")
        a = a.astype(np.float32, copy=True)
        if np.isnan(a).any():
            raise ValueError("logits: contains NaN")
        if not (a > -np.inf).any():
            raise ValueError("logits: every logit is -inf, no token can be sampled")
        return cls(np.arange(a.shape[0], dtype=np.int64), a, False)

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def sort(self) -> None:
        """Orders by descending logit, equal logits by increasing id (stable sort)."""
        if not self.sorted:
            order = np.argsort(-self.logits, kind="stable")
            self.ids, self.logits, self.sorted = self.ids[order], self.logits[order], True


def apply_penalties(c: Candidates, history: Sequence[int] | np.ndarray, last_n: int, repeat: float,
                    frequency: float, presence: float) -> None:
    """Repetition / frequency / presence penalties (``llama_sampler_penalties_apply``), in place.

    For each candidate seen ``count > 0`` times among the last ``last_n`` history tokens (-1: all):
    ``logit *= repeat`` if ``logit <= 0`` else ``logit /= repeat``, then
    ``logit -= count * frequency + presence``. No-op when ``last_n == 0`` or all three are off.
    Clears ``sorted``.
    """
    if last_n == 0 or (repeat == 1.0 and frequency == 0.0 and presence == 0.0):
        return
    h = np.asarray(history, dtype=np.int64).reshape(-1)
    if last_n > 0:
        h = h[-last_n:]
    if h.size == 0:
        return
    toks, counts = np.unique(h, return_counts=True)
    pos = np.searchsorted(toks, c.ids)
    pos = np.minimum(pos, toks.size - 1)
    seen = toks[pos] == c.ids
    if not seen.any():
        return
    lg = c.logits[seen]
    cnt = counts[pos[seen]].astype(np.float32)
    rep = np.float32(repeat)
    lg = np.where(lg <= 0, lg * rep, lg / rep)
    lg = lg - (cnt * np.float32(frequency) + np.float32(presence))
    c.logits[seen] = lg.astype(np.float32)
    c.sorted = False


def apply_top_k(c: Candidates, k: int) -> None:
    """Keeps the ``k`` largest logits, sorted descending (``llama_sampler_top_k_impl``); ``k <= 0``
    keeps all, ``k > n`` keeps all n (sorted). Among equal logits at the cut the lower ids stay."""
    if k <= 0:
        return
    k = min(k, len(c))
    if c.sorted:
        c.ids, c.logits = c.ids[:k], c.logits[:k]
        return
    if k < len(c):
        part = np.argpartition(-c.logits, k - 1)[:k]
        v = c.logits[part].min()
        above = np.flatnonzero(c.logits > v)
        ties = np.flatnonzero(c.logits == v)[:k - above.size]  # flatnonzero: increasing index
        sel = np.concatenate([above, ties])
    else:
        sel = np.arange(len(c))
    order = sel[np.lexsort((c.ids[sel], -c.logits[sel]))]
    c.ids, c.logits, c.sorted = c.ids[order], c.logits[order], True


def softmax(logits: np.ndarray) -> np.ndarray:
    """Probabilities of float32 logits [n] as ``llama_sampler_softmax_impl``: ``exp(l - max)`` in
    float32, divided by their float32 sum. Returns float32 [n]."""
    e = np.exp(logits - logits.max(), dtype=np.float32)
    return e / np.float32(e.sum(dtype=np.float32))


def apply_top_p(c: Candidates, p: float, min_keep: int = 0) -> None:
    """Nucleus filter (``llama_sampler_top_p_apply``): sorts, then keeps the shortest prefix whose
    float32 running probability sum is ``>= p`` and that holds ``>= min_keep`` tokens (all when no
    prefix qualifies). ``p >= 1`` is a no-op."""
    if p >= 1.0:
        return
    c.sort()
    cum = np.cumsum(softmax(c.logits), dtype=np.float32)
    ok = (cum >= np.float32(p)) & (np.arange(1, len(c) + 1) >= min_keep)
    hit = np.flatnonzero(ok)
    if hit.size:
        last = int(hit[0]) + 1
        c.ids, c.logits = c.ids[:last], c.logits[:last]


def apply_min_p(c: Candidates, p: float, min_keep: int = 0) -> None:
    """Min-p filter (``llama_sampler_min_p_apply``): keeps the tokens whose logit is
    ``>= max_logit + log(p)`` (probability ``>= p * p_max``), in their order; when fewer than
    ``min_keep`` pass, the ``min_keep`` largest stay. ``p <= 0`` is a no-op."""
    if p <= 0.0 or len(c) == 0:
        return
    min_logit = np.float32(c.logits.max()) + np.float32(math.log(p))
    keep = c.logits >= min_logit
    if keep.sum() >= max(min_keep, 1):
        c.ids, c.logits = c.ids[keep], c.logits[keep]
        return
    c.sort()
    c.ids, c.logits = c.ids[:min_keep], c.logits[:min_keep]


def apply_temperature(c: Candidates, temp: float) -> None:
    """Temperature (``llama_sampler_temp_impl``): ``logit /= temp``; ``temp <= 0`` keeps the first
    maximum of the current order and sets every other logit to -inf."""
    if temp <= 0.0:
        i = int(np.argmax(c.logits))
        keep = c.logits[i]
        c.logits[:] = -np.inf
        c.logits[i] = keep
        return
    c.logits = (c.logits / np.float32(temp)).astype(np.float32)


def greedy(logits: np.ndarray) -> int:
    """The id of the largest logit, the lowest id among equal maxima (``llama_sampler_greedy_apply``
    over an unsorted array: a later logit wins only when strictly larger)."""
    return int(np.argmax(logits))


class MT19937:
    """``std::mt19937`` seeded with one 32-bit value (NumPy's legacy RandomState, whose integer
    seeding is the reference ``init_genrand``), with libstdc++'s
    ``std::uniform_real_distribution<double>(0, 1)``."""

    def __init__(self, seed: int) -> None:
        self._rs = np.random.RandomState(int(seed) & 0xFFFFFFFF)

    def next_u32(self, n: int = 1) -> np.ndarray:
        """The next ``n`` raw 32-bit outputs (uint64 [n])."""
        return self._rs.randint(0, 1 << 32, size=n, dtype=np.uint64)

    def uniform(self) -> float:
        """One double in [0, 1): ``generate_canonical<double, 53>``: (r0 + r1 * 2^32) / 2^64."""
        r = self.next_u32(2)
        x = (float(r[0]) + float(r[1]) * 4294967296.0) / 18446744073709551616.0
        return x if x < 1.0 else math.nextafter(1.0, 0.0)


class Sampler:
    """llama.cpp's default common sampler chain over one logits vector per call.

    ``sample(logits, history)`` runs penalties (over ``history``) -> top-k -> top-p -> min-p ->
    temperature -> dist and returns the drawn id; with ``temp <= 0`` it returns :func:`greedy`
    of the penalised logits. The RNG state carries over from call to call (one draw per sampled
    token, as ``llama_sampler_dist``); :meth:`reset` reseeds it.

    Args:
        params: the settings (:class:`SamplerParams`).

    Raises:
        TypeError: ``params`` is not a SamplerParams.
    """

    def __init__(self, params: SamplerParams | None = None) -> None:
        if params is None:
            params = SamplerParams()
        if not isinstance(params, SamplerParams):
            raise TypeError(f"params: expected SamplerParams, got {type(params).__name__}")
        self.params = params
        self.reset()

    def reset(self) -> None:
        """Reseeds the RNG with ``params.seed`` (a fresh OS seed when it is None)."""
        seed = self.params.seed
        if seed is None:
            seed = int.from_bytes(os.urandom(4), "little")
        self.seed = int(seed)
        self._rng = MT19937(self.seed)

    def candidates(self, logits: np.ndarray, history: Sequence[int] | np.ndarray = ()) -> Candidates:
        """The candidates the chain leaves before the draw (penalties -> top-k -> top-p -> min-p ->
        temperature), for inspection; :meth:`sample` draws from them.

        Raises:
            ValueError: see :meth:`Candidates.from_logits`.
        """
        p = self.params
        c = Candidates.from_logits(logits)
        apply_penalties(c, history, p.repeat_last_n, p.repeat_penalty, p.frequency_penalty,
                        p.presence_penalty)
        apply_top_k(c, p.top_k)
        apply_top_p(c, p.top_p, p.min_keep)
        apply_min_p(c, p.min_p, p.min_keep)
        apply_temperature(c, p.temp)
        return c

    def sample(self, logits: np.ndarray, history: Sequence[int] | np.ndarray = ()) -> int:
        """Draws one token id from float logits [n_vocab] (``common_sampler_sample``).

        Args:
            logits: the model's float logits for the next token, ne = [n_vocab] (NumPy shape
                (n_vocab,)); not modified.
            history: the tokens so far (prompt and generated, oldest first), for the penalties.

        Returns:
            the sampled id in [0, n_vocab).

        Raises:
            ValueError: ``logits`` is not a non-empty 1-d float vector, holds NaN, or is all -inf.
        """
        p = self.params
        if p.temp <= 0.0:
            c = Candidates.from_logits(logits)
            apply_penalties(c, history, p.repeat_last_n, p.repeat_penalty, p.frequency_penalty,
                            p.presence_penalty)
            return greedy(c.logits)
        c = self.candidates(logits, history)
        return int(c.ids[self._draw(c.logits)])

    def _draw(self, logits: np.ndarray) -> int:
        """``llama_sampler_dist_apply``: float32 ``exp(l - max)``, double running sum, the first
        index whose running sum is ``>= total * u`` for one uniform double ``u``."""
        u = self._rng.uniform()
        if logits.shape[0] == 1:
            return 0
        e = np.exp(logits - logits.max(), dtype=np.float32).astype(np.float64)
        run = np.cumsum(e)
        i = int(np.searchsorted(run, run[-1] * u, side="left"))
        return min(i, logits.shape[0] - 1)
