"""``import ggmlpy`` loads none of the heavy optional libraries (ml_dtypes, numba, gguf, ray,
cupy, tokenizers, safetensors): they are imported where first needed, e.g. the BF16 dtype by
:func:`ggmlpy.core.types.bf16_dtype`. Each check runs in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("ml_dtypes", "numba", "llvmlite", "gguf", "ray", "cupy", "tokenizers", "safetensors")


def _run(code: str) -> str:
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_import_ggmlpy_loads_no_heavy_library():
    out = _run("import json, sys, ggmlpy\n"
               f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))")
    assert json.loads(out) == []


def test_bf16_dtype_is_resolved_on_first_use():
    out = _run("import sys, numpy as np, ggmlpy\n"
               "from ggmlpy.core.types import Type, type_from_dtype\n"
               "before = 'ml_dtypes' in sys.modules\n"
               "dt = Type.BF16.dtype\n"
               "import ml_dtypes\n"
               "x = np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16)\n"
               "print(before, dt == np.dtype(ml_dtypes.bfloat16), type_from_dtype(x.dtype).name,\n"
               "      Type.BF16.type_size, x.view(np.uint16).tolist())")
    # 1.5 = 0x3FC0 and -2.0 = 0xC000 in bfloat16 (the top half of the float32 bits)
    assert out.split() == ["False", "True", "BF16", "2", "[16320,", "49152]"]


def test_devices_command_loads_no_heavy_library_without_a_cuda_driver():
    out = _run("import ctypes, json, sys\n"
               "try:\n    ctypes.CDLL('libcuda.so.1'); has = True\nexcept OSError:\n    has = False\n"
               "from ggmlpy.cli import main\n"
               "import contextlib, io\n"
               "with contextlib.redirect_stdout(io.StringIO()):\n    main(['devices'])\n"
               f"print(json.dumps([has, sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})]))")
    has_driver, mods = json.loads(out)
    if not has_driver:  # with a driver, CuPy (and ml_dtypes through it) is imported to list GPUs
        assert mods == []
    else:
        assert "numba" not in mods and "ray" not in mods


def test_every_argument_parser_refuses_abbreviations():
    # OneLineArgumentParser sets allow_abbrev=False; a plain argparse parser must say so itself
    import ast

    missing = []
    for folder in ("ggmlpy", "scripts"):
        for p in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(p.read_text())):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "ArgumentParser"
                        and not any(k.arg == "allow_abbrev" and isinstance(k.value, ast.Constant)
                                    and k.value.value is False for k in node.keywords)):
                    missing.append(f"{p.relative_to(ROOT)}:{node.lineno}")
    assert missing == []
    from ggmlpy.core.check import OneLineArgumentParser

    p = OneLineArgumentParser(prog="x")
    p.add_argument("--similarity", action="store_true")
    assert p.allow_abbrev is False
