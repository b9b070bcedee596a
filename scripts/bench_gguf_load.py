"""Benchmark of opening and loading a GGUF file; prints JSON.

Each measurement runs in a fresh Python process (so resident-set sizes are its own), and the
kinds are interleaved over ``--repeat`` rounds (the file is read once first, so every run sees it
in the page cache). Kinds:

* ``ours_open``: ``ggmlpy.gguf.reader.GGUFReader(path)`` (header, all metadata, tensor infos);
  ``open_lists_s`` adds turning every metadata array into a Python list (what ``gguf_load``
  stores).
* ``ours_load``: ``ggmlpy.gguf_load(path, cpu)``: the same plus one WEIGHTS buffer of the CPU
  backend with every tensor copied in from the map (the mapped pages dropped after the copy).
  ``rss_*``: VmRSS before (imports done) and after the load, with the model alive.
* ``ggufpy_open``: gguf-py's ``gguf.GGUFReader(path)`` (what ggmlpy used before).
* ``llama_cpp_mmap`` / ``llama_cpp_read``: llama-cpp-python's ``Llama(path, n_ctx=512,
  n_gpu_layers=0, use_mmap=True/False)`` in the interpreter ``$GGMLPY_REF_PYTHON`` names (or ``--ref-python``), when that
  interpreter has ``llama_cpp``; with ``use_mmap=False`` llama.cpp reads the weights into its
  buffer as ``gguf_load`` does.

Times are seconds (wall clock, ``time.perf_counter``); the JSON gives each kind's runs and their
median. Usage: ``python scripts/bench_gguf_load.py [PATH] [--repeat N]``; PATH defaults to
``$GGMLPY_GEMMA3_GGUF``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_CHILD = r"""
import json, sys, time, resource

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

kind, path = sys.argv[1], sys.argv[2]
out = {}
if kind.startswith("llama_cpp"):
    import llama_cpp
    out["rss_before"] = rss()
    t0 = time.perf_counter()
    m = llama_cpp.Llama(path, n_ctx=512, n_gpu_layers=0, verbose=False,
                        use_mmap=kind == "llama_cpp_mmap")
    out["load_s"] = time.perf_counter() - t0
elif kind == "ggufpy_open":
    import gguf
    out["rss_before"] = rss()
    t0 = time.perf_counter()
    r = gguf.GGUFReader(path)
    out["open_s"] = time.perf_counter() - t0
    out["n_tensors"] = len(r.tensors)
else:
    import ggmlpy
    from ggmlpy.gguf.reader import GGUFReader
    from ggmlpy.gguf.weights import _plain
    cpu = ggmlpy.backend_cpu_init()
    out["rss_before"] = rss()
    if kind == "ours_open":
        t0 = time.perf_counter()
        r = GGUFReader(path)
        out["open_s"] = time.perf_counter() - t0
        meta = {k: _plain(v) for k, v in r.fields.items()}
        out["open_lists_s"] = time.perf_counter() - t0
        out["n_tensors"] = len(r.tensors)
    else:
        t0 = time.perf_counter()
        m = ggmlpy.gguf_load(path, cpu)
        out["load_s"] = time.perf_counter() - t0
        out["n_tensors"] = len(m.tensors)
        out["buffer_bytes"] = m.buffer.get_size()
out["rss_after"] = rss()
out["maxrss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps(out))
"""


def _run(python: str, kind: str, path: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([python, "-c", _CHILD, kind, path], capture_output=True, text=True,
                         env=env, timeout=600)
    if res.returncode:
        raise RuntimeError(f"{kind} failed: {res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("path", nargs="?", default=os.environ.get("GGMLPY_GEMMA3_GGUF"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--ggufpy-repeat", type=int, default=1,
                    help="rounds that include gguf-py's reader (slow)")
    ap.add_argument("--ref-python", default=os.environ.get("GGMLPY_REF_PYTHON", sys.executable))
    args = ap.parse_args()
    if not args.path or not Path(args.path).is_file():
        ap.error("give the GGUF file (or set GGMLPY_GEMMA3_GGUF)")
    path = str(Path(args.path).resolve())
    with open(path, "rb") as f:  # into the page cache
        while f.read(1 << 24):
            pass
    have_llama = Path(args.ref_python).is_file() and subprocess.run(
        [args.ref_python, "-c", "import llama_cpp"], capture_output=True).returncode == 0
    runs: dict[str, list[dict]] = {}
    for rnd in range(args.repeat):
        kinds = ["ours_open", "ours_load"]
        if rnd < args.ggufpy_repeat:
            kinds.append("ggufpy_open")
        if have_llama:
            kinds += ["llama_cpp_mmap", "llama_cpp_read"]
        for kind in kinds:
            py = args.ref_python if kind.startswith("llama_cpp") else sys.executable
            runs.setdefault(kind, []).append(_run(py, kind, path))
    summary = {}
    for kind, rs in runs.items():
        summary[kind] = {k: statistics.median(r[k] for r in rs) for k in rs[0]
                         if isinstance(rs[0][k], (int, float))}
    ours_open = summary["ours_open"]["open_s"]
    ratios = {}
    if "ggufpy_open" in summary:
        ratios["ggufpy_open_over_ours_open"] = summary["ggufpy_open"]["open_s"] / ours_open
    if have_llama:
        for k in ("llama_cpp_mmap", "llama_cpp_read"):
            ratios[f"ours_load_over_{k}"] = summary["ours_load"]["load_s"] / summary[k]["load_s"]
    print(json.dumps({"file": path, "file_bytes": os.path.getsize(path), "repeat": args.repeat,
                      "median": summary, "ratios": ratios, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
