"""docs/ops.md (the supported ops per backend) equals what the kernel registry generates
(scripts/gen_support_table.py --write regenerates it), and the generator reflects the registry."""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import pytest

from ggmlpy.backends.kernels import REGISTRY, registry
from ggmlpy.core.opcodes import Op
from ggmlpy.testops.families import all_cases
from ggmlpy.testops.support_table import BEGIN, END, readme_section, replace_readme_section, support_section

README = Path(__file__).resolve().parents[2] / "docs" / "ops.md"


def test_readme_table_equals_the_registry():
    pytest.importorskip("cupy")  # the CUDA column asks supports_op(node, cupy)
    text = README.read_text(encoding="utf-8")
    assert readme_section(text) == support_section(), \
        "docs/ops.md is stale: run python scripts/gen_support_table.py --write"


def _rows(section):
    return {ln.split(" | ")[0][2:]: ln.split(" | ")[1:] for ln in section.splitlines()
            if ln.startswith("| ") and not ln.startswith("| op |")}


def test_a_gap_on_one_array_module_shows_in_its_column_only(monkeypatch):
    fake_cupy = types.SimpleNamespace(__name__="cupy")
    cases = [c for c in all_cases() if c.op in ("ADD", "SQR", "MUL_MAT")]
    mods = {"numpy": np, "cupy": fake_cupy}
    before = _rows(support_section(cases, mods))
    assert before["ADD"] == ["f16, f32, f16/f32", "f16, f32, f16/f32", "bf16 |"]
    orig = REGISTRY.entry(Op.ADD)

    def no_f16_on_cupy(node, xp):
        if xp is fake_cupy and node.type.type_name == "f16":
            return False                                # a CuPy-only gap: no F16 ADD
        return orig.supports(node, xp)
    monkeypatch.setitem(REGISTRY._entries, Op.ADD,
                        registry.KernelEntry(Op.ADD, orig.make, no_f16_on_cupy))
    after = _rows(support_section(cases, mods))
    assert after["ADD"] == ["f16, f32, f16/f32", "f32", "bf16 |"]  # f16/f32 adds into f16
    assert after["SQR"] == before["SQR"] and after["MUL_MAT"] == before["MUL_MAT"]


def test_section_markers():
    text = f"intro\n{BEGIN}\nold\n{END}\ntail\n"
    assert readme_section(text) == "old\n"
    assert replace_readme_section(text, "new\n") == f"intro\n{BEGIN}\nnew\n{END}\ntail\n"
    with pytest.raises(ValueError, match="marker"):
        readme_section("no markers here")
    with pytest.raises(ValueError, match="marker"):
        readme_section(text + BEGIN)
