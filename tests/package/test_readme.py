"""The README's worked example runs as written and prints what it claims."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 2
    ns: dict = {"print": lambda *a, **k: None}
    for code in blocks:
        exec(compile(code, str(README), "exec"), ns)
    import ggmlpy as gp

    a = np.arange(12, dtype=np.float32).reshape(3, 4).astype(np.float64)
    c = np.ones((2, 4)) @ a.T * 0.5
    e = np.exp(c - c.max(axis=1, keepdims=True))
    ref = e / e.sum(axis=1, keepdims=True)
    # float32 softmax of values up to ~33 against float64: 1e-6 relative
    np.testing.assert_allclose(gp.backend_tensor_get(ns["d"])[0, 0], ref, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(gp.backend_tensor_get(ns["d2"])[0, 0], ref, rtol=1e-6, atol=1e-7)
    # the scheduler example really runs on the device, with b copied over from the CPU
    splits = ns["report"]["splits"]
    assert splits[0]["backend"] == "SIM0"
    assert [i["name"] for i in splits[0]["inputs"]] == ["b"]
