"""``BertModel.load(n_threads=)`` and ``embed --threads``: the CPU backend's thread count
(llama.cpp's ``-t``) reaches the backend, bad values are refused, and the embeddings match the
sentence-transformers fixture for 1, 2 and 3 threads (nodes split over threads compute the same
rows with the same kernels, so only the GEMM blocking can differ)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.model

EMB_MAX_ABS = 1e-5  # as tests/test_model_bert.py
EMB_MIN_COS = 0.99999


@pytest.fixture(scope="module")
def public(fixtures_dir: Path) -> dict:
    with open(fixtures_dir / "minilm_public.json", encoding="utf-8") as f:
        return json.load(f)


@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_n_threads_reaches_backend_and_matches_fixture(model_dir: Path, public: dict,
                                                       n_threads: int) -> None:
    from ggmlpy.models.bert import BertModel

    with BertModel.load(model_dir=model_dir, n_threads=n_threads, max_batch=8) as m:
        assert m._backends[-1].n_threads == n_threads
        emb = m.encode(public["sentences"], batch_size=8).astype(np.float64)
    ref = np.asarray(public["embeddings"], dtype=np.float64)
    assert np.abs(emb - ref).max() <= EMB_MAX_ABS
    cos = (emb * ref).sum(1) / (np.linalg.norm(emb, axis=1) * np.linalg.norm(ref, axis=1))
    assert cos.min() >= EMB_MIN_COS


@pytest.mark.parametrize("bad, exc", [(0, ValueError), (-2, ValueError), (513, ValueError),
                                      (True, TypeError),
                                      (2.0, TypeError), ("2", TypeError)])
def test_n_threads_refused(model_dir: Path, bad: object, exc: type) -> None:
    from ggmlpy.models.bert import BertModel

    with pytest.raises(exc, match="n_threads"):
        BertModel.load(model_dir=model_dir, n_threads=bad)


def test_cli_threads(model_dir: Path, capsys: pytest.CaptureFixture) -> None:
    from ggmlpy.models.cli import embed_main

    assert embed_main(["--model", str(model_dir), "--threads", "0", "x"]) == 2
    assert "--threads must be >= 1" in capsys.readouterr().err
    outs = []
    for t in ("1", "2"):
        assert embed_main(["--model", str(model_dir), "--threads", t, "--json", "--no-progress",
                           "ggml runs graphs", "NumPy runs arrays"]) == 0
        outs.append(np.asarray(json.loads(capsys.readouterr().out)["embeddings"]))
    assert outs[0].shape == (2, 384)
    assert np.abs(outs[0] - outs[1]).max() <= EMB_MAX_ABS
