"""all-MiniLM-L6-v2 on RAY devices: bit-identical to the CPU.

``embed --device RAY0`` (every layer on one actor) and the split CPU -> RAY0 -> RAY1 (``-ngl 4``:
embeddings and layers 0-1 on the CPU, layers 2-3 on RAY0, 4-5 on RAY1, pipelined with
``--parallel``) return exactly the CPU's embeddings on the fixture sentences: same kernels, same
inputs, so any difference is a transport or ordering bug. Uses the session's two RAY devices
(conftest ``ray_reg2``); skips without Ray, the model package or the fixtures.
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.ray, pytest.mark.model, pytest.mark.xdist_group("ray")]


@pytest.fixture(scope="module")
def sentences(fixtures_dir: Path) -> list[str]:
    with open(fixtures_dir / "minilm_public.json", encoding="utf-8") as f:
        public = json.load(f)
    # the short ones (the 256-token sentence is exercised on SIM by test_model_bert)
    return [s for s, t in zip(public["sentences"], public["token_ids"]) if len(t) < 100]


def _cpu_embeddings(model_dir: Path, sentences, batch_size: int) -> np.ndarray:
    from ggmlpy.models.bert import BertModel

    with BertModel.load(model_dir=model_dir, device="CPU", max_batch=4) as m:
        return m.encode(sentences, batch_size=batch_size)


def test_split_cpu_ray0_ray1_parallel_bit_identical(model_dir: Path, sentences, ray_reg2) -> None:
    d0, d1 = ray_reg2.devices
    from ggmlpy.models.bert import BertModel

    cpu = _cpu_embeddings(model_dir, sentences, 2)
    with BertModel.load(model_dir=model_dir, device=[d0, d1], n_gpu_layers=4, parallel=True,
                        max_batch=4) as m:
        got = m.encode(sentences, batch_size=2)
        info = {"devices": m.devices, "splits": m.n_splits}
        wb = {b.buft.name: b.size for b in m.weight_buffers}
    assert info == {"devices": ["RAY0", "RAY1", "CPU"], "splits": 3}
    assert set(wb) == {"CPU", "RAY0", "RAY1"} and wb["RAY0"] == wb["RAY1"]  # 2 layers each
    assert got.dtype == np.float32 and got.shape == cpu.shape
    np.testing.assert_array_equal(got, cpu)


def test_embed_cli_device_ray0_bit_identical(model_dir: Path, sentences, ray_reg2) -> None:
    from ggmlpy.backend import registry
    from ggmlpy.models.cli import embed_main

    def run(*args: str) -> dict:
        buf = io.StringIO()
        with redirect_stdout(buf):
            assert embed_main(["--model", str(model_dir), "--json", "--no-progress",
                               "--batch-size", "4", *args, *sentences[:4]]) == 0
        return json.loads(buf.getvalue())

    cpu = run()
    registry.register(ray_reg2)
    try:
        ray = run("--device", "RAY0")
    finally:
        registry.unregister("RAY")
    assert ray["devices"] == ["RAY0", "CPU"] and ray["n_gpu_layers"] == 6
    assert ray["embeddings"] == cpu["embeddings"]
