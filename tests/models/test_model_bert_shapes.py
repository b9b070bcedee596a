"""MiniLM batch shapes (``ggmlpy.models.bert``): the batch-length rule (exact lengths, or a
length already built within the bucket), graph/plan reuse across a stream of shapes, the compute
buffer grown once per call to the largest shape seen, input order kept.

References: the same model with ``seq_bucket=1`` (each batch padded to its longest sequence
exactly) and sentences encoded one at a time; both are independent of the batching under test.
The length rule itself is checked on a table and on random streams without the model. Skips
without the model package (``model_dir`` fixture), except the rule's tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.model

WORDS = ("graph tensor buffer kernel river mountain quietly engineer bright forest library "
         "station computes carries ancient modern").split()


def _sentences(n: int, seed: int, lo: int = 1, hi: int = 40) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(WORDS[i] for i in rng.integers(0, len(WORDS), size=int(rng.integers(lo, hi))))
            for _ in range(n)]


@pytest.fixture(scope="module")
def models(model_dir: Path):
    from ggmlpy.models.bert import BertModel

    bucketed = BertModel.load(model_dir=model_dir, max_batch=4)
    exact = BertModel.load(model_dir=model_dir, max_batch=4, seq_bucket=1)
    yield bucketed, exact
    bucketed.close()
    exact.close()


def _batches(model, sents: list[str], batch_size: int) -> list[tuple[int, int]]:
    """(n_seq, longest) of each batch ``encode`` makes: longest first."""
    lens = sorted((len(t) for t in model.token_ids(sents)), reverse=True)
    return [(len(lens[i:i + batch_size]), lens[i]) for i in range(0, len(lens), batch_size)]


def test_padded_equals_unpadded(models) -> None:
    bucketed, exact = models
    sents = _sentences(11, seed=1)
    batches = _batches(bucketed, sents, 4)
    assert any(n % 8 for _, n in batches)   # padding really is added somewhere below
    for n_seq, longest in batches:          # lengths at the bucket tops built before: reused
        bucketed._graph_for(n_seq, bucketed._bucket_length(longest))
    before = bucketed.cached_graphs
    a = bucketed.encode(sents, batch_size=4)
    b = exact.encode(sents, batch_size=4)
    assert bucketed.cached_graphs == before  # every batch ran padded to its bucket's top
    # padded keys are masked (-inf -> weight exactly 0) and padded tokens get pooling weight 0:
    # only float32 summation order over the extra zeros may differ (GEMM blocking)
    assert np.max(np.abs(a - b)) <= 2e-7
    assert any(L % 8 for _, L in exact.cached_graphs)  # the reference really ran unpadded lengths


@pytest.mark.parametrize("batch_size", [1, 3, 4])
def test_batching_returns_input_order(models, batch_size: int) -> None:
    bucketed, _ = models
    sents = _sentences(7, seed=2, lo=1, hi=30)
    got = bucketed.encode(sents, batch_size=batch_size)
    one_by_one = np.stack([bucketed.encode([s])[0] for s in sents])
    assert np.max(np.abs(got - one_by_one)) <= 2e-7
    # the rows differ from each other, so any permutation of the output would be caught
    dist = np.abs(one_by_one[:, None, :] - one_by_one[None, :, :]).max(axis=-1)
    assert dist[~np.eye(len(sents), dtype=bool)].min() > 1e-3


def test_graphs_reused_across_a_stream_of_shapes(models) -> None:
    bucketed, exact = models
    # one batch of 2 each, longest 27, 17, 17, 26, 22 tokens: 4 exact shapes; the rule runs
    # 27 (first of bucket (24, 32]), 17 (first of (16, 24]), 17, 26 -> 27 (built, in [26, 32]),
    # 22 -> 24 (its bucket holds only 17 < 22: the top): 3 shapes
    stream = [_sentences(2, seed=10 + i, lo=1, hi=24) for i in range(5)]
    assert [_batches(bucketed, s, 4) for s in stream] == [[(2, n)] for n in (27, 17, 17, 26, 22)]
    for m in models:
        m._graphs.clear()                  # other tests of this module built shapes already
    b0, e0 = bucketed.n_graph_builds, exact.n_graph_builds
    for s in stream:                       # first pass: builds one graph per new shape
        bucketed.encode(s, batch_size=4)
        exact.encode(s, batch_size=4)
    assert (bucketed.n_graph_builds - b0, exact.n_graph_builds - e0) == (3, 4)
    assert set(bucketed.cached_graphs) == {(2, 27), (2, 17), (2, 24)}
    built_b = bucketed.n_graph_builds
    for s in stream:                       # second pass: every shape is cached
        bucketed.encode(s, batch_size=4)
    assert bucketed.n_graph_builds == built_b


def test_plans_reused_for_repeated_shapes(models, monkeypatch) -> None:
    from ggmlpy.backends.cpu import backend as cpu

    bucketed, _ = models
    builds = []
    real = cpu.build_plan

    def counting(*a, **kw):
        builds.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(cpu, "build_plan", counting)
    sents = _sentences(4, seed=20, lo=10, hi=14)  # one batch, one shape
    first = bucketed.encode(sents)
    n0 = len(builds)
    for _ in range(3):
        assert np.array_equal(bucketed.encode(sents), first)
    assert len(builds) == n0               # the same shape again: no new plan


def test_plans_kept_per_shape_across_a_stream_of_shapes(models, monkeypatch) -> None:
    # 3 batch shapes interleaved: (3, 40), (2, 16), (1, 8) tokens; the scheduler keeps the split
    # views of every graph (not only the last one), so each shape's plan is built once
    from ggmlpy.backends.cpu import backend as cpu

    bucketed, _ = models
    builds = []
    real = cpu.build_plan

    def counting(*a, **kw):
        builds.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(cpu, "build_plan", counting)
    stream = [_sentences(3, seed=31, lo=30, hi=34), _sentences(2, seed=32, lo=10, hi=13),
              _sentences(1, seed=33, lo=2, hi=4)]
    assert len({len(s) for s in stream}) == 3   # 3 batch sizes: 3 shapes whatever the lengths
    firsts = [bucketed.encode(s) for s in stream]   # the largest first: no buffer growth later
    n_first = len(builds)
    for _ in range(2):
        for s, want in zip(stream, firsts):
            assert np.array_equal(bucketed.encode(s), want)
    assert len(builds) == n_first              # later passes reuse every shape's plan


def test_compute_buffer_grows_to_largest_shape_seen(model_dir: Path) -> None:
    from ggmlpy.models.bert import BertModel

    with BertModel.load(model_dir=model_dir, max_batch=32) as m:
        size = lambda: sum(m.sched.get_buffer_size(b) for b in m.sched.backends)  # noqa: E731
        s0 = size()
        m.encode(["a b c"])
        s1 = size()
        m.encode(_sentences(8, seed=3, lo=60, hi=80))
        s2 = size()
        m.encode(["a b c", "d e"])
        s3 = size()
    # not reserved for 32 x 256 tokens up front: a longer batch has to grow the buffer
    assert s0 <= s1 < s2
    assert s3 == s2                         # never shrinks, no re-reservation for smaller shapes


def test_seq_bucket_validated(model_dir: Path) -> None:
    from ggmlpy.models.bert import BertModel

    for bad in (0, -8, 2.5, True):
        with pytest.raises(ValueError, match="seq_bucket"):
            BertModel.load(model_dir=model_dir, seq_bucket=bad)


# ---------------------------------------------------------------------------------------------
# the batch-length rule (BertModel._batch_length), without the model


def _rule(built: set[tuple[int, int]], seq_bucket: int = 8, max_len: int = 256):
    from collections import OrderedDict
    from types import SimpleNamespace

    from ggmlpy.models.bert import BertModel

    m = BertModel()
    m.seq_bucket = seq_bucket
    m.config = SimpleNamespace(max_seq_length=max_len)
    m._graphs = OrderedDict((k, None) for k in sorted(built))
    return m


@pytest.mark.parametrize("built, n_seq, longest, want", [
    (set(), 2, 17, 17),                       # first of its bucket (16, 24]: exact
    (set(), 2, 16, 16),                       # a bucket top is its own bucket's top
    ({(2, 17)}, 2, 17, 17),                   # built: reused
    ({(2, 17)}, 2, 18, 24),                   # bucket holds a shorter length only: the top
    ({(2, 17)}, 3, 18, 18),                   # other batch sizes do not count
    ({(2, 17)}, 2, 15, 15),                   # other buckets do not count
    ({(2, 17), (2, 24)}, 2, 18, 24),
    ({(2, 20), (2, 22)}, 2, 18, 20),          # the shortest built length >= longest
    ({(2, 20), (2, 22)}, 2, 21, 22),
    ({(2, 20), (2, 22)}, 2, 23, 24),
    ({(2, 25)}, 2, 24, 24),                   # 25 is in the next bucket: not a candidate
    ({(2, 20)}, 2, 19, 20),
])
def test_batch_length_table(built, n_seq, longest, want) -> None:
    assert _rule(built)._batch_length(n_seq, longest) == want


def test_batch_length_exact_and_capped() -> None:
    assert _rule({(2, 20)}, seq_bucket=1)._batch_length(2, 19) == 19   # buckets of 1: exact
    # the cap: max_seq_length 20, longest 19 -> bucket (12, 20] with top 20, never above
    assert _rule({(1, 18)}, max_len=20)._batch_length(1, 19) == 20
    assert _rule(set(), max_len=20)._batch_length(1, 20) == 20


@pytest.mark.parametrize("seed", range(6))
def test_batch_length_rule_on_random_streams(seed: int) -> None:
    # a stream of batches of random sizes and lengths: every batch runs at a length in
    # [longest, its bucket's top] (never more padding than multiple-of-8 buckets), either
    # exactly its longest or a length built before or the top; each bucket ends with at most
    # two lengths per batch size, and the stream settles (the last 400 batches build little)
    rng = np.random.default_rng(seed)
    sb, max_len = int(rng.choice([4, 8, 16])), int(rng.choice([64, 250, 256]))
    m = _rule(set(), seq_bucket=sb, max_len=max_len)
    builds = []
    for i in range(1200):
        n_seq, longest = int(rng.integers(1, 4)), int(rng.integers(1, max_len + 1))
        top = min(-(-longest // sb) * sb, max_len)
        L = m._batch_length(n_seq, longest)
        assert longest <= L <= top
        assert L in (longest, top) or (n_seq, L) in m._graphs
        if (n_seq, L) not in m._graphs:
            m._graphs[(n_seq, L)] = None
            builds.append(i)
    per_bucket: dict[tuple[int, int], int] = {}
    for n_seq, L in m._graphs:
        b = (n_seq, -(-L // sb))
        per_bucket[b] = per_bucket.get(b, 0) + 1
    assert max(per_bucket.values()) <= 2
    assert len(m._graphs) <= 2 * 3 * (-(-max_len // sb))
    assert sum(i >= 800 for i in builds) <= len(builds) // 4


def test_compute_buffer_grows_once_per_call(model_dir: Path, monkeypatch) -> None:
    # batches run longest first, so the first batch of a call is its largest shape: the compute
    # buffer is (re)allocated at most once per encode, however many shapes the call runs
    from ggmlpy.backends.cpu import backend as cpu
    from ggmlpy.models.bert import BertModel

    allocs: list[int] = []
    real = cpu.CPUBufferType._alloc_buffer

    def counting(self, size):
        allocs.append(size)
        return real(self, size)

    monkeypatch.setattr(cpu.CPUBufferType, "_alloc_buffer", counting)
    with BertModel.load(model_dir=model_dir, max_batch=4) as m:
        sents = _sentences(18, seed=5, lo=1, hi=60)
        assert len({L for _, L in _batches(m, sents, 4)}) >= 4   # several shapes in one call
        allocs.clear()
        first = m.encode(sents, batch_size=4)
        assert len(allocs) == 1                  # grown once, at the first (largest) batch
        size = sum(m.sched.get_buffer_size(b) for b in m.sched.backends)
        allocs.clear()
        assert np.max(np.abs(m.encode(_sentences(9, seed=6, lo=1, hi=40), batch_size=4)
                             - m.encode(_sentences(9, seed=6, lo=1, hi=40), batch_size=1))) <= 2e-7
        assert np.array_equal(m.encode(sents, batch_size=4), first)
        assert allocs == []                      # smaller shapes later: no growth at all
        assert sum(m.sched.get_buffer_size(b) for b in m.sched.backends) == size
