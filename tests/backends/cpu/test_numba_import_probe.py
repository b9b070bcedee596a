"""Numba's import-time probe for SciPy's BLAS is not paid by ggmlpy (:mod:`ggmlpy.backends.cpu.jit`):
in a fresh process, building and running a compiled CPU kernel leaves ``scipy.linalg`` unimported
(28 MiB of resident memory), no ``None`` placeholder behind, and ``np.dot`` inside a user's
``@njit`` function still compiles and is right afterwards (it imports SciPy's BLAS itself). A
process that imported SciPy's BLAS first keeps Numba's BLAS probe as it was."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ggmlpy.backends.cpu import jit as cpu_jit

pytestmark = pytest.mark.skipif(not cpu_jit.available(), reason="numba not installed")

_CHILD = r"""
import json, sys
import numpy as np
pre = sys.argv[1] == "1"
if pre:
    import scipy.linalg.cython_blas  # noqa: F401
from ggmlpy.backends.cpu import jit as cpu_jit
assert cpu_jit.warm_up()  # every kernel of the element-wise family compiled or loaded
from ggmlpy.backends.cpu import qmatmul
from ggmlpy.core.types import Type
from ggmlpy.quants import quantize
w = quantize(np.ones((8, 64), np.float32), Type.Q8_0).reshape(8, -1)
assert np.allclose(qmatmul.mul_mat(Type.Q8_0, w, np.ones((2, 64), np.float32)), 64, rtol=1e-3)
out = {"linalg": "scipy.linalg" in sys.modules,
       "placeholder": "scipy.linalg.cython_blas" in sys.modules
                      and sys.modules["scipy.linalg.cython_blas"] is None}
import numba.np.arraymath as am
out["have_blas"] = bool(am._HAVE_BLAS)
from numba import njit
a = np.arange(6, dtype=np.float64).reshape(2, 3); b = np.arange(3, dtype=np.float64)
out["dot_ok"] = bool(np.array_equal(njit(lambda p, q: np.dot(p, q))(a, b), a @ b))
print(json.dumps(out))
"""


@pytest.mark.parametrize("pre", [False, True])
def test_numba_imported_without_scipy_linalg(pre: bool) -> None:
    # without SciPy (the project's extras do not need it) Numba's probe has nothing to import
    # and np.dot in @njit code is unavailable anyway: nothing to test
    pytest.importorskip("scipy.linalg.cython_blas", reason="SciPy is not installed")
    r = subprocess.run([sys.executable, "-c", _CHILD, "1" if pre else "0"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["dot_ok"] and not got["placeholder"]
    if pre:
        assert got["have_blas"] and got["linalg"]
    else:
        assert not got["have_blas"] and not got["linalg"]
