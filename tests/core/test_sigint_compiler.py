"""A real SIGINT while Numba compiles: held until the compiler returns, then a
``KeyboardInterrupt`` (ggmlpy.core.sigint.deferring_handler); the compiled function is intact.

Regression: ``python -m ggmlpy embed`` interrupted during its first kernel compilation lost the
interrupt (llvmlite's object-cache callback swallowed it, the job ran on) or failed with
``RuntimeError: no compiled object yet``. The table sends the signal at fractions of the
measured compile time, so every phase of the compiler (typing, lowering, LLVM, the object cache)
is hit on some run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import types
from pathlib import Path

import pytest

from ggmlpy.core import sigint

pytest.importorskip("numba")
ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = r"""
import json, signal, sys, threading, time
import numpy as np
import numba
from ggmlpy.core import sigint

frac, work = float(sys.argv[1]), sys.argv[2]
body = "\n".join(f"    s += np.sin(x[{i} % x.size]) * {i + 1}.0" for i in range(120))
with open(f"{work}/kernels_mod.py", "w") as fh:  # a file: Numba caches only functions with one
    fh.write("import numpy as np\nimport numba\n" + "".join(
        f"@numba.njit(cache=True)\ndef f{k}(x):\n    s = 0.0\n{body}\n    return s\n"
        for k in range(2)))
sys.path.insert(0, work)
import kernels_mod
x = np.arange(7, dtype=np.float64)
t0 = time.perf_counter(); kernels_mod.f0(x); compile_s = time.perf_counter() - t0
f = kernels_mod.f1
expect = sum(np.sin(x[i % x.size]) * (i + 1.0) for i in range(120))
main = threading.main_thread().ident
threading.Timer(frac * compile_s, signal.pthread_kill, (main, signal.SIGINT)).start()
out = {"compile_s": compile_s, "returned_first": False}
with sigint.defer_in_compiler():
    try:
        t0 = time.perf_counter()
        f(x)
        out["returned_first"] = True
        time.sleep(max(2.0, 2 * compile_s))  # an interrupt still held would arrive here
        out["result"] = "no interrupt"
    except KeyboardInterrupt:
        out["result"] = "interrupted"
out["after"] = bool(abs(f(x) - expect) <= 1e-9 * abs(expect))
out["n_overloads"] = len(f.overloads)
print(json.dumps(out))
"""


@pytest.mark.parametrize("frac", [0.1, 0.3, 0.5, 0.7, 0.85, 0.95])
def test_sigint_during_compile_is_delivered_after_it(frac, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GGMLPY_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["NUMBA_CACHE_DIR"] = str(tmp_path)  # a cold cache: the compile writes the object cache
    r = subprocess.run([sys.executable, "-c", _SCRIPT, str(frac), str(tmp_path)], capture_output=True,
                       text=True, timeout=240, env=env)
    assert r.returncode == 0, r.stderr
    assert "Exception ignored" not in r.stderr, r.stderr
    out = json.loads(r.stdout)
    assert out["result"] == "interrupted" and out["returned_first"] is True, out
    assert out["after"] is True and out["n_overloads"] == 1, out


def _frame_of(module: str) -> types.FrameType:
    ns: dict = {"__name__": module, "sys": sys}
    exec("def f():\n    return sys._getframe()\n", ns)
    return ns["f"]()


@pytest.mark.parametrize(("module", "inside"), [
    ("numba.core.dispatcher", True), ("llvmlite.binding.executionengine", True), ("numba", True),
    ("numbat", False), ("ggmlpy.backends.cpu.jit", False), ("__main__", False)])
def test_in_compiler_names_numba_and_llvmlite_frames(module, inside):
    assert sigint.in_compiler(_frame_of(module)) is inside
    assert sigint.in_compiler(None) is False


def test_outside_the_compiler_the_handler_raises_at_once():
    with pytest.raises(KeyboardInterrupt):
        sigint.deferring_handler(signal.SIGINT, sys._getframe())


def test_defer_in_compiler_restores_the_previous_handler():
    before = signal.getsignal(signal.SIGINT)
    with sigint.defer_in_compiler():
        inside = signal.getsignal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before
    assert inside is (sigint.deferring_handler if before is signal.default_int_handler else before)
