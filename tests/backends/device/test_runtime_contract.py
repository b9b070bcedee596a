"""The device runtime contract is complete: every runtime member the device backend and the plan
runner read is declared on :class:`~ggmlpy.backends.device.backend.Runtime` (with its default
for the optional ones), and the probed device members are declared on the Device contract."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ggmlpy.backend.interface import Device
from ggmlpy.backends.cpu.backend import cpu_device
from ggmlpy.backends.device.backend import Runtime

PKG = Path(__file__).resolve().parents[3] / "ggmlpy"
READERS = [PKG / "backends" / "device" / "backend.py", PKG / "backends" / "plan.py"]


def _runtime_members_read(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            v = node.value
            if isinstance(v, ast.Name) and v.id in ("runtime", "rt"):
                names.add(node.attr)
            elif isinstance(v, ast.Attribute) and v.attr == "runtime":
                names.add(node.attr)
    return names


@pytest.mark.parametrize("path", READERS, ids=lambda p: p.name)
def test_every_runtime_member_read_is_declared(path: Path) -> None:
    read = _runtime_members_read(path)
    assert len(read) >= 3  # the walk finds the reads
    missing = sorted(n for n in read if not hasattr(Runtime, n))
    assert missing == [], f"{path.name} reads runtime members Runtime does not declare: {missing}"


def test_optional_runtime_members_have_defaults() -> None:
    rt = Runtime()
    assert rt.supports_graphs is False and rt.pinned_direct_upload is False
    assert rt.launch_count() is None
    with rt.activate(0), rt.on_stream(None):
        pass
    with pytest.raises(NotImplementedError, match="needs malloc"):
        rt.malloc(0, 16)
    with pytest.raises(NotImplementedError, match="cannot capture graphs"):
        rt.graph_capture(None, [])


def test_probed_device_members_are_in_the_contract() -> None:
    class Bare(Device):
        pass

    d = Bare()
    assert d.last_stream is None and d.supports_op_memo_token() is None
    assert cpu_device().supports_op_memo_token() is not None  # the CPU memoises its answers
