"""Lines of code per package and per file of ``ggmlpy/``, and each package's line budget.

``python scripts/sz.py`` prints, per file and per package (a folder of ``ggmlpy/``, its
subfolders counted on their own), the code lines (without blank lines, comment-only lines and
docstrings) and the total lines, then checks every package against :data:`BUDGET` (code lines)
and exits 1 when one is over. ``--json`` prints the same as JSON. The test suite runs the check
(``tests/package/test_line_budget.py``); a package that outgrows its budget is split, or its
budget raised here with the reason in the commit.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "ggmlpy"

#: code lines allowed per package (folder relative to the repository root), ~12% above the
#: count written after each (the count when the budget was set)
BUDGET: dict[str, int] = {
    "ggmlpy": 260,  # 225
    "ggmlpy/alloc": 860,  # 763
    "ggmlpy/backend": 1020,  # 909
    "ggmlpy/backends": 780,  # 693
    "ggmlpy/backends/cpu": 6400,  # 6367 (1418 + the dot kernels of qmatmul*.py with their VNNI/GFNI legacy rows, 4x4 register tiles, two-weight-row passes and Q8_K amax passes + the ROPE kernel + the GEMM path: dequant_kernels.py, qgemm.py + the dot tasks shared by the threads: spin.py, qmatmul_tasks.py + ggml-cpu's x86 orders: sgemm_f16*, soft_max_ggml*, repack_q4k*, vec_dot_q6k*, kquant_order_tasks, q8k_act, fma_ir + the legacy tiles in 512-bit registers: legacy_zmm_ir, the vector x86 Q8_0/Q8_1 activation quantizer + the F32 x F32 MUL_MAT orders sgemm_f32* and NORM in ggml-cpu's order + the K-quant orders' prompt batches on integer GEMMs: kquant_igemm* + the fast mode's Q8_0 integer GEMM: igemm_q8_0* + the AVX512-VNNI int16 GEMM of the K-quant orders, no MKL needed: s16_vnni_ir + the compiled RMS_NORM, the F16C conversion and the 512-bit F16/BF16 rows)
    "ggmlpy/backends/cuda": 1060,  # 942
    "ggmlpy/backends/device": 530,  # 469
    "ggmlpy/backends/kernels": 1800,  # 1776 (+ FLASH_ATTN_EXT: only the cells some row sees converted, the K/V converter bound at build); 1566
    "ggmlpy/backends/ray": 910,  # 805
    "ggmlpy/core": 1640,  # 1460
    "ggmlpy/gguf": 820,  # 732
    "ggmlpy/models": 2220,  # 1982 (the embedding CLI with llama-embedding's flags and sentence-transformers' encode options)
    "ggmlpy/models/llm": 2550,  # 2276 (1796 + the generation front end: loop and timings, the generate command, the Gemma download)
    "ggmlpy/ops": 1120,  # 993
    "ggmlpy/quants": 880,  # 783 (312 + Q8 activation formats, vec_dot referee, row validation, ggml-cpu's x86/arm Q8 quantizers)
    "ggmlpy/sched": 1510,  # 1343
    "ggmlpy/testops": 2430,  # 2168
}


def _docstring_lines(tree_src: str) -> set[int]:
    """Line numbers (1-based) covered by module, class and function docstrings."""
    import ast

    lines: set[int] = set()
    for node in ast.walk(ast.parse(tree_src)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    return lines


def count(path: Path) -> tuple[int, int]:
    """``(code lines, total lines)`` of one Python file: code lines hold at least one token that
    is not a comment, a newline or part of a docstring."""
    src = path.read_text()
    doc = _docstring_lines(src)
    code: set[int] = set()
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER, tokenize.ENCODING)
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type in skip:
            continue
        for line in range(tok.start[0], tok.end[0] + 1):
            if line not in doc:
                code.add(line)
    return len(code), len(src.splitlines())


def measure() -> dict[str, dict]:
    """``{package: {"code": n, "total": n, "files": {name: [code, total]}}}`` for every folder
    of ``ggmlpy/`` holding Python files."""
    out: dict[str, dict] = {}
    for p in sorted(PKG.rglob("*.py")):
        if "__pycache__" in p.parts:
            continue
        pkg = p.parent.relative_to(ROOT).as_posix()
        code, total = count(p)
        entry = out.setdefault(pkg, {"code": 0, "total": 0, "files": {}})
        entry["code"] += code
        entry["total"] += total
        entry["files"][p.name] = [code, total]
    return out


def over_budget(sizes: dict[str, dict]) -> list[str]:
    """One line per package over its budget, or without one."""
    bad = []
    for pkg, entry in sizes.items():
        limit = BUDGET.get(pkg)
        if limit is None:
            bad.append(f"{pkg}: no budget in scripts/sz.py BUDGET ({entry['code']} code lines)")
        elif entry["code"] > limit:
            bad.append(f"{pkg}: {entry['code']} code lines, budget {limit}")
    return bad


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--json", action="store_true", help="print JSON")
    args = p.parse_args(argv)
    sizes = measure()
    bad = over_budget(sizes)
    if args.json:
        print(json.dumps({"packages": sizes, "budget": BUDGET, "over_budget": bad}, indent=1))
        return 1 if bad else 0
    for pkg, entry in sizes.items():
        print(f"{pkg:<28} {entry['code']:>6} {entry['total']:>6}   budget {BUDGET.get(pkg, '-')}")
        for name, (code, total) in sorted(entry["files"].items(), key=lambda kv: -kv[1][0]):
            print(f"    {name:<24} {code:>6} {total:>6}")
    code = sum(e["code"] for e in sizes.values())
    total = sum(e["total"] for e in sizes.values())
    print(f"{'total':<28} {code:>6} {total:>6}   (code lines, all lines)")
    for line in bad:
        print(f"over budget: {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
