"""One-off check: ``gguf_load`` on a real file gives the tensors and metadata the gguf-py-based
loader gave; prints JSON.

The previous loader (``ggmlpy/gguf/weights.py`` at git commit ``26e3772``, which parsed with
gguf-py's ``GGUFReader``) is loaded from git history as a module of its own and both load the file
into the CPU backend. For every tensor: type, ``ne``, raw bytes, and the float32 values from
``ggmlpy.quants.dequantize`` (compared as bit patterns, row chunks of at most 4096 rows) must be
identical; the metadata dicts must be equal. Usage:
``python scripts/check_gguf_load_against_ggufpy.py [PATH]`` (default ``$GGMLPY_GEMMA3_GGUF``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OLD_COMMIT = "26e3772"


def _old_loader():
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{OLD_COMMIT}:ggmlpy/gguf/weights.py"],
                         capture_output=True, text=True, check=True).stdout
    d = tempfile.mkdtemp()
    f = Path(d) / "old_gguf_weights.py"
    f.write_text(src)
    spec = importlib.util.spec_from_file_location("old_gguf_weights", f)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _raw(t) -> np.ndarray:
    from ggmlpy import backend_tensor_get

    g = backend_tensor_get(t)
    return np.frombuffer(g, np.uint8) if isinstance(g, (bytes, bytearray)) else \
        np.ascontiguousarray(g).reshape(-1).view(np.uint8)


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("path", nargs="?", default=os.environ.get("GGMLPY_GEMMA3_GGUF"))
    args = ap.parse_args()
    if not args.path or not Path(args.path).is_file():
        ap.error("give the GGUF file (or set GGMLPY_GEMMA3_GGUF)")
    sys.path.insert(0, str(ROOT))
    import ggmlpy
    from ggmlpy.core.types import Type
    from ggmlpy.quants import dequantize

    cpu = ggmlpy.backend_cpu_init()
    old = _old_loader()
    t0 = time.perf_counter()
    a = old.gguf_load(args.path, cpu)
    t_old = time.perf_counter() - t0
    t0 = time.perf_counter()
    b = ggmlpy.gguf_load(args.path, cpu)
    t_new = time.perf_counter() - t0
    bad: list[str] = []
    n_values = 0
    for name, ta in a.tensors.items():
        tb = b.tensors.get(name)
        if tb is None or (ta.type, list(ta.ne)) != (tb.type, list(tb.ne)):
            bad.append(f"{name}: type/ne differ")
            continue
        ra, rb = _raw(ta), _raw(tb)
        if not np.array_equal(ra, rb):
            bad.append(f"{name}: bytes differ")
            continue
        if ta.type in (Type.I8, Type.I16, Type.I32, Type.I64):
            continue
        ne = [int(x) for x in ta.ne]
        rows = int(np.prod(ne[1:]))
        row = ta.type.row_size(ne[0])
        for r0 in range(0, rows, 4096):
            r1 = min(rows, r0 + 4096)
            da = dequantize(ra[r0 * row:r1 * row], ta.type, [ne[0], r1 - r0])
            db = dequantize(rb[r0 * row:r1 * row], tb.type, [ne[0], r1 - r0])
            n_values += da.size
            if not np.array_equal(da.view(np.uint32), db.view(np.uint32)):
                bad.append(f"{name}: dequantized rows {r0}..{r1} differ")
                break
    meta_equal = a.metadata == b.metadata and a.metadata_types == b.metadata_types
    print(json.dumps({"file": str(Path(args.path).resolve()), "old_commit": OLD_COMMIT,
                      "tensors_old": len(a.tensors), "tensors_new": len(b.tensors),
                      "dequantized_values_compared": n_values, "mismatches": bad,
                      "metadata_equal": meta_equal, "old_load_s": round(t_old, 3),
                      "new_load_s": round(t_new, 3)}, indent=1))


if __name__ == "__main__":
    main()
