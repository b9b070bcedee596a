"""ggmlpy.models.llm.sampling: each stage against a NumPy computation of its definition.

Definitions (llama.cpp, llama-sampler.cpp): penalties ``l <= 0 ? l * r : l / r`` then
``- count * f - (count > 0) * p`` over the last N history tokens; top-k the k largest; top-p the
shortest most-probable prefix with probability sum >= p; min-p probabilities >= p * p_max;
temperature ``l / t``; dist the first token whose running probability reaches ``u * total``.
Probability thresholds are drawn away from the cumulative sums (margin 1e-4) so float32 vs
float64 rounding cannot move a cut.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from ggmlpy.models.llm.sampling import (
    MT19937,
    Candidates,
    Sampler,
    SamplerParams,
    apply_min_p,
    apply_penalties,
    apply_temperature,
    apply_top_k,
    apply_top_p,
    greedy,
)


def _logits(n: int, seed: int, scale: float = 3.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * scale).astype(np.float32)


def _probs64(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


@pytest.mark.parametrize("last_n,repeat,freq,pres", [(8, 1.3, 0.0, 0.0), (64, 1.1, 0.5, 0.25),
                                                     (-1, 2.0, 0.1, 1.0), (3, 1.0, 0.0, 0.7),
                                                     (0, 1.5, 1.0, 1.0), (16, 1.0, 0.0, 0.0)])
def test_penalties(last_n: int, repeat: float, freq: float, pres: float) -> None:
    n = 40
    logits = _logits(n, 1)
    history = np.random.default_rng(2).integers(0, n, size=30).tolist()
    window = history if last_n == -1 else history[-last_n:] if last_n > 0 else []
    want = logits.copy()
    if not (repeat == 1.0 and freq == 0.0 and pres == 0.0):
        for tok, cnt in Counter(window).items():
            x = want[tok]
            x = x * np.float32(repeat) if x <= 0 else x / np.float32(repeat)
            want[tok] = x - (np.float32(cnt) * np.float32(freq) + np.float32(pres))
    c = Candidates.from_logits(logits)
    apply_penalties(c, history, last_n, repeat, freq, pres)
    np.testing.assert_array_equal(c.ids, np.arange(n))
    np.testing.assert_allclose(c.logits, want, rtol=1e-6, atol=1e-6)
    if last_n != 0 and (repeat, freq, pres) != (1.0, 0.0, 0.0):
        assert not np.array_equal(c.logits, logits)  # the case really penalises something


@pytest.mark.parametrize("n,k", [(50, 1), (50, 7), (50, 50), (50, 80), (1000, 40), (5, 0), (5, -3)])
def test_top_k(n: int, k: int) -> None:
    logits = _logits(n, 3)
    c = Candidates.from_logits(logits)
    apply_top_k(c, k)
    if k <= 0:
        np.testing.assert_array_equal(c.ids, np.arange(n))
        return
    want = np.argsort(-logits.astype(np.float64))[:min(k, n)]
    np.testing.assert_array_equal(c.ids, want)
    np.testing.assert_array_equal(c.logits, logits[want])
    assert c.sorted


def test_top_k_ties_keep_lower_ids() -> None:
    logits = np.array([1.0, 3.0, 2.0, 2.0, 2.0, 0.5], np.float32)
    c = Candidates.from_logits(logits)
    apply_top_k(c, 3)
    np.testing.assert_array_equal(c.ids, [1, 2, 3])


def _draw_p(cum: np.ndarray, rng: np.random.Generator) -> float:
    """A threshold in (0, 1) at least 1e-4 away from every cumulative sum."""
    while True:
        p = float(rng.uniform(0.05, 0.98))
        if np.abs(cum - p).min() > 1e-4:
            return p


@pytest.mark.parametrize("seed", range(6))
def test_top_p(seed: int) -> None:
    n = 60
    logits = _logits(n, 10 + seed, scale=1.5)
    order = np.argsort(-logits.astype(np.float64), kind="stable")
    cum = np.cumsum(_probs64(logits)[order])
    p = _draw_p(cum, np.random.default_rng(seed))
    last = int(np.argmax(cum >= p)) + 1
    c = Candidates.from_logits(logits)
    apply_top_p(c, p)
    np.testing.assert_array_equal(c.ids, order[:last])
    # min_keep raises the count when the prefix is shorter
    c = Candidates.from_logits(logits)
    apply_top_p(c, p, min_keep=last + 5)
    np.testing.assert_array_equal(c.ids, order[:last + 5])


def test_top_p_one_is_noop() -> None:
    logits = _logits(30, 4)
    c = Candidates.from_logits(logits)
    apply_top_p(c, 1.0)
    np.testing.assert_array_equal(c.ids, np.arange(30))
    assert not c.sorted


@pytest.mark.parametrize("seed", range(6))
def test_min_p(seed: int) -> None:
    n = 80
    logits = _logits(n, 20 + seed)
    probs = _probs64(logits)
    ratio = probs / probs.max()
    p = _draw_p(ratio, np.random.default_rng(100 + seed))
    want = np.flatnonzero(ratio >= p)  # kept in id order (the unsorted path)
    c = Candidates.from_logits(logits)
    apply_min_p(c, p)
    np.testing.assert_array_equal(c.ids, want)
    # fewer than min_keep pass: the min_keep most probable stay
    c = Candidates.from_logits(logits)
    apply_min_p(c, p, min_keep=want.size + 3)
    np.testing.assert_array_equal(c.ids, np.argsort(-probs, kind="stable")[:want.size + 3])


def test_min_p_zero_is_noop() -> None:
    c = Candidates.from_logits(_logits(30, 5))
    apply_min_p(c, 0.0)
    assert len(c) == 30


@pytest.mark.parametrize("temp", [0.25, 0.8, 1.0, 2.5])
def test_temperature(temp: float) -> None:
    logits = _logits(30, 6)
    c = Candidates.from_logits(logits)
    apply_temperature(c, temp)
    np.testing.assert_allclose(c.logits, logits.astype(np.float64) / temp, rtol=1e-6)


def test_temperature_zero_keeps_first_max() -> None:
    logits = np.array([0.0, 5.0, -1.0, 5.0], np.float32)
    c = Candidates.from_logits(logits)
    apply_temperature(c, 0.0)
    np.testing.assert_array_equal(c.logits, [-np.inf, 5.0, -np.inf, -np.inf])


def test_greedy_tie_rule_and_temp_zero_sampler() -> None:
    logits = np.array([1.0, 4.0, 4.0, -2.0, 4.0], np.float32)
    assert greedy(logits) == 1
    s = Sampler(SamplerParams(temp=0.0, seed=1))
    assert s.sample(logits) == 1
    # penalties apply before the argmax: token 1 seen twice with repeat 2 -> 2.0 < 4.0
    s = Sampler(SamplerParams(temp=-1.0, repeat_penalty=2.0, repeat_last_n=8, seed=1))
    assert s.sample(logits, history=[1, 1]) == 2
    big = _logits(5000, 7)
    assert Sampler(SamplerParams(temp=0.0)).sample(big) == int(np.argmax(big))


def test_mt19937_matches_std() -> None:
    # the C++ standard fixes the 10000th output of std::mt19937 with the default seed 5489
    rng = MT19937(5489)
    out = rng.next_u32(10000)
    assert int(out[0]) == 3499211612 and int(out[-1]) == 4123659995
    # uniform_real_distribution<double>: (r0 + r1 * 2^32) / 2^64 from the next two outputs
    a, b = MT19937(42), MT19937(42)
    r = b.next_u32(2)
    assert a.uniform() == (float(r[0]) + float(r[1]) * 2.0 ** 32) / 2.0 ** 64


@pytest.mark.parametrize("params", [
    SamplerParams(seed=3),
    SamplerParams(temp=1.3, top_k=0, top_p=0.9, min_p=0.0, seed=9),
    SamplerParams(temp=0.7, top_k=5, top_p=1.0, min_p=0.1, repeat_penalty=1.2, seed=11)])
def test_chain_draw_is_the_dist_definition(params: SamplerParams) -> None:
    n = 200
    history = [3, 7, 7, 50]
    rng = MT19937(params.seed)
    s = Sampler(params)
    for step in range(12):
        logits = _logits(n, 200 + step, scale=2.0)
        cand = s.candidates(logits, history)
        # the expected candidate set from the stage definitions, composed
        x = logits.copy()
        apply_penalties(c := Candidates.from_logits(x), history, params.repeat_last_n, params.repeat_penalty,
                        params.frequency_penalty, params.presence_penalty)
        kept = np.argsort(-c.logits.astype(np.float64), kind="stable")
        if params.top_k > 0:
            kept = kept[:params.top_k]
        if params.top_p < 1:
            cum = np.cumsum(_probs64(c.logits[kept]))
            kept = kept[:int(np.argmax(cum >= params.top_p)) + 1]
        if params.min_p > 0:
            pr = _probs64(c.logits[kept])
            kept = kept[pr >= params.min_p * pr.max()]
        assert np.array_equal(np.sort(cand.ids), np.sort(kept))
        # dist: the first candidate (in the chain's order) whose running probability >= u * total
        u = rng.uniform()
        pr = _probs64(cand.logits)
        want = int(cand.ids[np.searchsorted(np.cumsum(pr), u * pr.sum(), side="left")])
        assert s.sample(logits, history) == want


def test_seeded_reproducibility() -> None:
    logits = np.zeros(1000, np.float32)  # flat: every draw is the RNG's
    p = SamplerParams(temp=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=1234)
    a = [Sampler(p).sample(logits) for _ in range(3)]
    assert a[0] == a[1] == a[2]
    s1, s2 = Sampler(p), Sampler(p)
    s3 = Sampler(SamplerParams(temp=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=99))
    seq1 = [s1.sample(logits) for _ in range(20)]
    assert seq1 == [s2.sample(logits) for _ in range(20)]
    assert seq1 != [s3.sample(logits) for _ in range(20)]
    s1.reset()
    assert [s1.sample(logits) for _ in range(20)] == seq1


def test_draw_frequencies_follow_the_distribution() -> None:
    logits = np.array([2.0, 1.0, 0.0, -1.0, 0.5], np.float32)
    s = Sampler(SamplerParams(temp=0.9, top_k=0, top_p=1.0, min_p=0.0, seed=5))
    n = 20000
    counts = np.bincount([s.sample(logits) for _ in range(n)], minlength=5)
    want = _probs64(logits / np.float32(0.9))
    # 5 sigma of a binomial count
    assert np.all(np.abs(counts - n * want) <= 5 * np.sqrt(n * want * (1 - want)) + 1)


def test_edge_cases() -> None:
    one = np.full(100, -np.inf, np.float32)
    one[37] = -3.0
    for params in (SamplerParams(seed=1), SamplerParams(temp=0.0), SamplerParams(top_k=1000, seed=2),
                   SamplerParams(top_k=0, top_p=1.0, min_p=0.0, seed=3)):
        assert Sampler(params).sample(one) == 37
    small = _logits(7, 8)
    assert Sampler(SamplerParams(top_k=10 ** 6, seed=4)).sample(small) in range(7)
    with pytest.raises(ValueError, match="every logit is -inf"):
        Sampler(SamplerParams(seed=1)).sample(np.full(5, -np.inf, np.float32))
    with pytest.raises(ValueError, match="NaN"):
        Sampler(SamplerParams(seed=1)).sample(np.array([0.0, np.nan], np.float32))
    with pytest.raises(ValueError, match="1-d"):
        Sampler(SamplerParams(seed=1)).sample(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="repeat_penalty"):
        SamplerParams(repeat_penalty=0.0)
    with pytest.raises(ValueError, match="seed"):
        SamplerParams(seed=-1)
    with pytest.raises(TypeError, match="top_k"):
        SamplerParams(top_k=2.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="SamplerParams"):
        Sampler({"temp": 1.0})  # type: ignore[arg-type]


def test_seeded_draws_match_llama_cpp() -> None:
    # tests/data/llm_sampling_ref.npz: llama.cpp's chain (llama-cpp-python 0.3.36, scripts/
    # make_llm_sampling_reference.py) on seeded logits [24 steps, 300 ids] per case, prompt tokens
    # accepted first, each drawn id accepted after its step
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "data" / "llm_sampling_ref.npz"
    d = np.load(path)
    meta = json.loads(bytes(d["meta"]).decode("utf-8"))
    assert len(meta["cases"]) == 8
    for ci, c in enumerate(meta["cases"]):
        s = Sampler(SamplerParams(temp=c["temp"], top_k=c["top_k"], top_p=c["top_p"], min_p=c["min_p"],
                                  repeat_penalty=c["repeat"], repeat_last_n=c["last_n"],
                                  frequency_penalty=c["freq"], presence_penalty=c["present"],
                                  min_keep=c["min_keep"], seed=c["seed"]))
        history = d[f"prompt_{ci}"].tolist()
        got = []
        for step in range(meta["steps"]):
            tok = s.sample(d[f"logits_{ci}"][step], history)
            got.append(tok)
            history.append(tok)
        assert got == d[f"ids_{ci}"].tolist(), f"case {ci} {c}"
