"""BertModel with several offload devices (``device=[...]`` or ``"A,B"``): the last
``n_gpu_layers`` layers are shared in order, in contiguous chunks, and the result equals the CPU's
bit for bit (same NumPy kernels on SIM devices). Ray's version of this runs in test_ray_minilm.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.model

SENTENCES = ["A short sentence.", "Another, slightly longer sentence about the weather today.",
             "Third."]


def _weights_per_buffer(m) -> dict[str, int]:
    return {b.buft.name: b.size for b in m.weight_buffers}


@pytest.mark.parametrize("ngl, want", [(5, {"SIM0": 3, "SIM1": 2}), (2, {"SIM0": 1, "SIM1": 1}),
                                       (1, {"SIM0": 1})])
def test_layers_shared_in_order_and_exact(model_dir: Path, ngl: int, want: dict, sim_devices) -> None:
    from ggmlpy.models.bert import BertModel

    with BertModel.load(model_dir=model_dir, device="CPU", max_batch=4) as cpu:
        ref = cpu.encode(SENTENCES, batch_size=2)
        layer_bytes = sum(t.nbytes for t in (cpu.layers[0].wq, cpu.layers[0].bq, cpu.layers[0].wk,
                                            cpu.layers[0].bk, cpu.layers[0].wv, cpu.layers[0].bv,
                                            cpu.layers[0].wo, cpu.layers[0].bo,
                                            cpu.layers[0].attn_norm_w, cpu.layers[0].attn_norm_b,
                                            cpu.layers[0].w_up, cpu.layers[0].b_up,
                                            cpu.layers[0].w_down, cpu.layers[0].b_down,
                                            cpu.layers[0].out_norm_w, cpu.layers[0].out_norm_b))
    d0, d1 = sim_devices(2)
    with BertModel.load(model_dir=model_dir, device=[d0, d1], n_gpu_layers=ngl, parallel=True,
                        max_batch=4) as m:
        got = m.encode(SENTENCES, batch_size=2)
        sizes = _weights_per_buffer(m)
        layer_dev = [m.layers[i].wq.buffer.buft.name for i in range(6)]
        assert m.devices == ["SIM0", "SIM1", "CPU"]
    expect_layers = ["CPU"] * (6 - ngl) + [d for d, n in want.items() for _ in range(n)]
    assert layer_dev == expect_layers
    for name, n in want.items():
        assert layer_bytes * n <= sizes[name] < layer_bytes * n + 4096  # n layers, padding only
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("device, needle", [("SIM0,CPU", "the CPU cannot be one of several"),
                                            ("SIM0,SIM0", "must not list a device twice")])
def test_device_list_errors(model_dir: Path, device: str, needle: str, fresh_registry) -> None:
    from ggmlpy.backends.sim import register_sim_devices
    from ggmlpy.models.bert import BertModel

    register_sim_devices(1)  # by name, as the CLI would: into this test's fresh registry
    with pytest.raises(ValueError, match=needle):
        BertModel.load(model_dir=model_dir, device=device, n_gpu_layers=2)
