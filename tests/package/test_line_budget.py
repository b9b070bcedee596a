"""Every package of ``ggmlpy/`` within its line budget (``scripts/sz.py``), and the counter
itself on a file of known content."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _sz():
    spec = importlib.util.spec_from_file_location("ggmlpy_sz", ROOT / "scripts" / "sz.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_package_within_its_budget() -> None:
    sz = _sz()
    sizes = sz.measure()
    assert "ggmlpy/backends/cpu" in sizes and sizes["ggmlpy/core"]["code"] > 0
    assert sz.over_budget(sizes) == []


def test_count_skips_blank_comment_and_docstring_lines(tmp_path: Path) -> None:
    src = ('"""Module doc,\n\nthree lines."""\n'
           "# a comment\n"
           "\n"
           "def f(x):\n"
           "    '''f's doc.'''\n"
           "    y = (x +  # trailing comment\n"
           "         1)\n"
           "    s = '''not a docstring\n"
           "    '''\n"
           "    return y\n")
    p = tmp_path / "m.py"
    p.write_text(src)
    # code: def, y = (x +, 1), s = ''' (2 lines), return
    assert _sz().count(p) == (6, 12)


def test_over_budget_names_the_package() -> None:
    sz = _sz()
    sizes = {"ggmlpy/core": {"code": sz.BUDGET["ggmlpy/core"] + 1, "total": 0, "files": {}},
             "ggmlpy/new": {"code": 3, "total": 3, "files": {}}}
    assert sz.over_budget(sizes) == [
        f"ggmlpy/core: {sz.BUDGET['ggmlpy/core'] + 1} code lines, budget {sz.BUDGET['ggmlpy/core']}",
        "ggmlpy/new: no budget in scripts/sz.py BUDGET (3 code lines)"]
