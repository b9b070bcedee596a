"""MiniLM batch shapes (``ggmlpy.models.bert``): length-bucketed batches, graph/plan reuse across a
stream of shapes, the compute buffer grown to the largest shape seen, input order kept.

References: the same model with ``seq_bucket=1`` (each batch padded to its longest sequence
exactly, the pre-bucketing behaviour) and sentences encoded one at a time; both are independent
of the batching under test. Skips without the model package (``model_dir`` fixture)."""

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


def test_bucketed_equals_unbucketed(models) -> None:
    bucketed, exact = models
    sents = _sentences(11, seed=1)
    lens = [len(t) for t in bucketed.token_ids(sents)]
    assert any(n % 8 for n in lens)  # padding really is added somewhere
    a = bucketed.encode(sents, batch_size=4)
    b = exact.encode(sents, batch_size=4)
    # padded keys are masked (-inf -> weight exactly 0) and padded tokens get pooling weight 0:
    # only float32 summation order over the extra zeros may differ (GEMM blocking)
    assert np.max(np.abs(a - b)) <= 2e-7
    assert all(L % 8 == 0 for _, L in bucketed._graphs)
    assert any(L % 8 for _, L in exact._graphs)  # the reference really ran unpadded lengths


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
    # longest sequences 27, 17, 17, 26, 22 tokens: 4 exact shapes, 2 buckets (24 and 32)
    stream = [_sentences(2, seed=10 + i, lo=1, hi=24) for i in range(5)]  # one batch each
    for m in models:
        m._graphs.clear()                  # other tests of this module built shapes already
    b0, e0 = bucketed.n_graph_builds, exact.n_graph_builds
    for s in stream:                       # first pass: builds one graph per new shape
        bucketed.encode(s, batch_size=4)
        exact.encode(s, batch_size=4)
    assert (bucketed.n_graph_builds - b0, exact.n_graph_builds - e0) == (2, 4)
    built_b = bucketed.n_graph_builds
    for s in stream:                       # second pass: every shape is cached
        bucketed.encode(s, batch_size=4)
    assert bucketed.n_graph_builds == built_b


def test_plans_reused_for_repeated_shapes(models, monkeypatch) -> None:
    from ggmlpy.backends import cpu

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
    from ggmlpy.backends import cpu

    bucketed, _ = models
    builds = []
    real = cpu.build_plan

    def counting(*a, **kw):
        builds.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(cpu, "build_plan", counting)
    stream = [_sentences(3, seed=31, lo=30, hi=34), _sentences(2, seed=32, lo=10, hi=13),
              _sentences(1, seed=33, lo=2, hi=4)]
    shapes = {(len(s), bucketed._bucket_length(max(len(t) for t in bucketed.token_ids(s))))
              for s in stream}
    assert len(shapes) == 3
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
