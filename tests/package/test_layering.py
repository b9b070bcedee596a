"""The package's import layering, checked on the source with ``ast`` (no import side effects).

Two rules (ARCHITECTURE.md, "each layer imports only the ones above it"):

* every ``ggmlpy`` import of a module, at any depth (module body or a function's late import),
  goes to a module of the same or a lower layer in :data:`LAYERS`; ``if TYPE_CHECKING:`` blocks
  are annotations only and are not imports at run time;
* the module-level imports form no cycle.

"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "ggmlpy"

#: Layers, lowest first; a module belongs to the layer of the longest prefix that matches it
#: (a prefix covers its submodules; the package roots in :data:`EXACT` match only themselves, so
#: a new module must be given its layer here).
LAYERS: list[tuple[str, ...]] = [
    ("ggmlpy.core.check", "ggmlpy.core.errors", "ggmlpy.core.opcodes", "ggmlpy.core.special",
     "ggmlpy.core.snapshot", "ggmlpy.alloc.dyn_alloc", "ggmlpy.core.sigint"),
    ("ggmlpy.core.types", "ggmlpy.core.env"),
    ("ggmlpy.quants",),
    ("ggmlpy.core.tensor",),
    ("ggmlpy.core.graph", "ggmlpy.core"),
    ("ggmlpy.ops",),
    ("ggmlpy.backend.write_gen",),
    ("ggmlpy.backend.interface", "ggmlpy.backend.buffers"),
    ("ggmlpy.backend.tensor_data", "ggmlpy.backend"),
    ("ggmlpy.backend.registry",),
    ("ggmlpy.alloc",),
    ("ggmlpy.sched",),
    ("ggmlpy.backends.cpu.fma_ir",),
    ("ggmlpy.backends.cpu.jit_kernels", "ggmlpy.backends.cpu.qmatmul_ir",
     "ggmlpy.backends.cpu.legacy_zmm_ir", "ggmlpy.backends.cpu.igemm_q8_0_ir",
     "ggmlpy.backends.cpu.s16_vnni_ir",
     "ggmlpy.backends.cpu.rope_ggml_kernel", "ggmlpy.backends.cpu.spin",
     "ggmlpy.backends.cpu.sgemm_f16_kernel", "ggmlpy.backends.cpu.soft_max_ggml_kernel",
     "ggmlpy.backends.cpu.sgemm_f32_kernel",
     "ggmlpy.backends.cpu.repack_q4k_kernel", "ggmlpy.backends.cpu.vec_dot_q6k_kernel"),
    ("ggmlpy.backends.cpu.qmatmul_kernels", "ggmlpy.backends.cpu.dequant_kernels",
     "ggmlpy.backends.cpu.kquant_igemm_kernel", "ggmlpy.backends.cpu.igemm_q8_0"),
    ("ggmlpy.backends.cpu.qmatmul_tasks",),
    ("ggmlpy.backends.cpu.kquant_order_tasks",),
    ("ggmlpy.backends.cpu.fastpath", "ggmlpy.backends.cpu.jit", "ggmlpy.backends.cpu.blas",
     "ggmlpy.backends.cpu.qmatmul"),
    ("ggmlpy.backends.cpu.qgemm", "ggmlpy.backends.cpu.q8k_act",
     "ggmlpy.backends.cpu.kquant_igemm"),
    ("ggmlpy.backends.kernels", "ggmlpy.backends.cuda.kernels", "ggmlpy.backends.cuda.quant",
     "ggmlpy.backends.cuda.gemm"),
    ("ggmlpy.backends.cpu.variants", "ggmlpy.backends.cpu.rope_ggml",
     "ggmlpy.backends.cpu.sgemm_f16", "ggmlpy.backends.cpu.sgemm_f32", "ggmlpy.backends.cpu.soft_max_ggml",
     "ggmlpy.backends.cpu.repack_q4k", "ggmlpy.backends.cpu.vec_dot_q6k"),
    ("ggmlpy.backends.plan", "ggmlpy.backends.ray.graph_spec", "ggmlpy.backends.ray.env"),
    ("ggmlpy.backends.cpu.threads",),
    ("ggmlpy.backends.cpu.backend", "ggmlpy.backends.cpu"),
    ("ggmlpy.backends.device", "ggmlpy.backends.ray.actor"),
    ("ggmlpy.backends.sim", "ggmlpy.backends.cuda.runtime", "ggmlpy.backends.ray.runtime",
     "ggmlpy.backends.cuda", "ggmlpy.backends.ray"),
    ("ggmlpy.backends.interop",),
    ("ggmlpy.backends",),
    ("ggmlpy.gguf", "ggmlpy.cli_names"),
    ("ggmlpy.testops",),
    ("ggmlpy.models",),
    ("ggmlpy.cli",),
    ("ggmlpy.__main__", "ggmlpy"),
]

#: package roots that match only themselves (their submodules have layers of their own)
EXACT = {"ggmlpy", "ggmlpy.backends", "ggmlpy.core", "ggmlpy.backend", "ggmlpy.backends.cpu",
         "ggmlpy.backends.cuda", "ggmlpy.backends.ray"}


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _rank(mod: str) -> int:
    best, rank = -1, None
    for i, layer in enumerate(LAYERS):
        for prefix in layer:
            covers = mod == prefix or (prefix not in EXACT and mod.startswith(prefix + "."))
            if covers and len(prefix) > best:
                best, rank = len(prefix), i
    if rank is None:
        raise AssertionError(f"module {mod} is in no layer: add it to LAYERS in {__file__}")
    return rank


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(mod: str, top_level_only: bool) -> set[str]:
    """The ggmlpy modules ``mod`` imports (``from .x import y`` counts as ``x.y`` when that is a
    module, else ``x``)."""
    path = MODULES[mod]
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for c in child.orelse:
                    visit(c)
                continue
            if top_level_only and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                     ast.Lambda)):
                continue
            if isinstance(child, ast.ImportFrom):
                if child.level:
                    base = mod.split(".")
                    if not is_pkg:
                        base = base[:-1]
                    base = base[:len(base) - (child.level - 1)]
                    name = ".".join(base + ([child.module] if child.module else []))
                else:
                    name = child.module or ""
                if name.startswith("ggmlpy"):
                    for a in child.names:
                        full = f"{name}.{a.name}"
                        found.add(full if full in MODULES else name)
            elif isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name.startswith("ggmlpy"))
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    found.discard(mod)
    return found


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_module_imports_only_its_layer_or_lower(mod):
    own = _rank(mod)
    up = sorted(d for d in _imports(mod, top_level_only=False)
                if _rank(d) > own )
    assert not up, f"{mod} (layer {own}) imports modules of higher layers: {up}"


def test_no_import_cycles_at_module_level():
    graph = {m: _imports(m, top_level_only=True) & set(MODULES) for m in MODULES}
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def dfs(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cycle = stack[stack.index(d):] + [d]
                raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
            if d not in state:
                dfs(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            dfs(m)


def test_tensor_module_imports_no_backend_at_run_time():
    # Context(no_alloc=False) gets its host buffers injected by the CPU backend, never imported
    deps = _imports("ggmlpy.core.tensor", top_level_only=False)
    assert deps <= {"ggmlpy.core.opcodes", "ggmlpy.core.types", "ggmlpy.core.snapshot", "ggmlpy.core.errors",
                    "ggmlpy.core.check"}, deps


def test_the_checker_sees_a_late_upward_import(tmp_path, monkeypatch):
    # the rule can fail: a function-level import of a higher layer is reported
    fake = tmp_path / "graph.py"
    fake.write_text("def f():\n    from ggmlpy.sched.scheduler import Scheduler\n    return Scheduler\n")
    monkeypatch.setitem(MODULES, "ggmlpy.core.graph", fake)
    assert "ggmlpy.sched.scheduler" in _imports("ggmlpy.core.graph", top_level_only=False)
    assert "ggmlpy.sched.scheduler" not in _imports("ggmlpy.core.graph", top_level_only=True)
    with pytest.raises(AssertionError, match="higher layers"):
        test_module_imports_only_its_layer_or_lower("ggmlpy.core.graph")


def test_a_module_outside_the_table_is_reported():
    with pytest.raises(AssertionError, match="in no layer"):
        _rank("ggmlpy.brand_new_module")
    with pytest.raises(AssertionError, match="in no layer"):
        _rank("ggmlpy.backends.brand_new_runtime")
