"""The trimmed MiniLM copy carried to GPU machines computes exactly what the full model does."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.model

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _load_script(name):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_trimmed_model_is_exact(tmp_path, fixtures_dir, model_dir):
    from ggmlpy.models.bert import BertModel

    trim = _load_script("trim_minilm")
    info = trim.trim(tmp_path / "minilm", fixtures_dir, model_dir)
    assert 0 < info["bytes"] < 48e6
    fx_full = json.loads((fixtures_dir / "minilm_public.json").read_text())
    fx_trim = json.loads((tmp_path / "minilm" / "fixture.json").read_text())
    with BertModel.load(model_dir) as full, BertModel.load(tmp_path / "minilm") as small:
        a = full.encode_ids(fx_full["token_ids"], batch_size=8)
        b = small.encode_ids(fx_trim["token_ids"], batch_size=8)
    # the same rows, the same graph, the same kernels: bit-identical
    np.testing.assert_array_equal(a, b)
    ref = np.asarray(fx_full["embeddings"], np.float64)
    assert np.abs(b - ref).max() <= 1e-5
