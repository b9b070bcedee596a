"""Structure of the ``ggmlpy.ops`` package: public names, generated in-place twins, module sizes.

The name lists below were captured from ``ggmlpy.ops.__all__`` and ``ggmlpy.__all__`` on ``main``
before ``ops.py`` became a package (commit fdcb3a5); they are written out so that a name that
disappears or appears makes this test fail.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import zlib
from pathlib import Path

import numpy as np
import pytest

import ggmlpy
from ggmlpy import ops
from ggmlpy.core.opcodes import Op, UnaryOp
from ggmlpy.core.tensor import Context, Tensor
from ggmlpy.core.types import Type
from ggmlpy.ops._variants import inplace_variant

OPS_PUBLIC_BEFORE = """
Prec SortOrder ROPE_TYPE_NORMAL ROPE_TYPE_NEOX set_name set_input set_output set_param
build_forward_expand dup dup_inplace add add_inplace add1 add1_inplace sub sub_inplace mul
mul_inplace div div_inplace sqr sqr_inplace sqrt sqrt_inplace log log_inplace sin sin_inplace cos
cos_inplace scale scale_inplace scale_bias scale_bias_inplace clamp leaky_relu acc acc_inplace set
set_inplace set_1d set_1d_inplace set_2d set_2d_inplace sum sum_rows mean argmax argsort repeat
repeat_4d concat cpy cast cont cont_1d cont_2d cont_3d cont_4d reshape reshape_1d reshape_2d
reshape_3d reshape_4d view_1d view_2d view_3d view_4d permute transpose get_rows set_rows pad pad_ext arange
timestep_embedding norm norm_inplace rms_norm rms_norm_inplace group_norm group_norm_inplace
l2_norm l2_norm_inplace mul_mat mul_mat_set_prec out_prod diag_mask_inf diag_mask_inf_inplace
diag_mask_zero diag_mask_zero_inplace soft_max soft_max_inplace soft_max_ext soft_max_ext_inplace
rope rope_inplace rope_ext rope_ext_inplace flash_attn_ext flash_attn_ext_set_prec unary
unary_inplace abs abs_inplace sgn sgn_inplace neg neg_inplace step step_inplace tanh tanh_inplace
elu elu_inplace relu relu_inplace sigmoid sigmoid_inplace gelu gelu_inplace gelu_quick
gelu_quick_inplace gelu_erf gelu_erf_inplace silu silu_inplace hardswish hardsigmoid exp
exp_inplace glu glu_split reglu reglu_swapped reglu_split geglu geglu_swapped geglu_split swiglu
swiglu_swapped swiglu_split geglu_erf geglu_erf_swapped geglu_erf_split geglu_quick
geglu_quick_swapped geglu_quick_split
""".split()

GGMLPY_OWN_BEFORE = """
Type row_size type_from_dtype Op UnaryOp GluOp GgmlpyError OutOfMemoryError NotAllocatedError
UnsupportedOpError GraphFullError BackendUnavailableError ComputeError Tensor Context Flag Graph
new_graph graph_view Status BufferUsage DeviceType DeviceCaps DeviceProps BufferType Buffer
MultiBuffer Backend Device Reg Event tensor_alloc view_init backend_tensor_set backend_tensor_get
backend_tensor_memset backend_tensor_copy backend_tensor_set_async backend_tensor_get_async
backend_tensor_copy_async event_new event_record event_wait event_synchronize event_query
reg_count reg_get reg_by_name dev_count dev_get dev_by_name dev_by_type devices
backend_init_by_name backend_init_by_type backend_init_best register_sim_devices backend_cpu_init
cpu_buffer_type cpu_buffer_from_array GraphAllocator TensorAllocator backend_alloc_ctx_tensors
backend_alloc_ctx_tensors_from_buft alloc_ctx_tensors_size Scheduler graph_copy
compare_graph_backend
""".split()

#: every in-place twin ggmlpy.ops exports (read from ``ops.__all__``, so a new twin is checked
#: without a list edit); each must be generated from its base
TWINS = sorted(n for n in ops.__all__ if n.endswith("_inplace"))
OPS_DIR = Path(ops.__file__).parent


def test_public_names_unchanged() -> None:
    # the package may gain ops; none of these may go missing
    assert not set(OPS_PUBLIC_BEFORE) - set(ops.__all__)
    # ggmlpy itself may gain names (other modules add exports); none of these may go missing
    missing = set(GGMLPY_OWN_BEFORE + OPS_PUBLIC_BEFORE) - set(ggmlpy.__all__)
    assert not missing, sorted(missing)
    for name in GGMLPY_OWN_BEFORE:
        assert getattr(ggmlpy, name) is not None, name
    for name in OPS_PUBLIC_BEFORE:
        obj = getattr(ops, name)
        assert getattr(ggmlpy, name) is obj, name
        assert getattr(importlib.import_module("ggmlpy.ops"), name) is obj


def test_submodules_do_not_shadow_ops() -> None:
    # importing every submodule must leave ops.unary, ops.set, ... the functions
    for info in pkgutil.iter_modules([str(OPS_DIR)]):
        importlib.import_module(f"ggmlpy.ops.{info.name}")
        assert info.name not in OPS_PUBLIC_BEFORE, info.name
    for name in OPS_PUBLIC_BEFORE:
        assert not inspect.ismodule(getattr(ops, name)), name


@pytest.mark.parametrize("name", TWINS)
def test_twin_is_generated_from_its_base(name: str) -> None:
    twin, base = getattr(ops, name), getattr(ops, name.removesuffix("_inplace"))
    assert twin.__wrapped_base__ is base
    assert twin.__name__ == name
    assert inspect.signature(twin) == inspect.signature(base)
    assert f":func:`{base.__name__}`" in twin.__doc__
    assert f"``ggml_{name}``" in twin.__doc__


def test_twin_rejects_a_bad_call_naming_itself() -> None:
    ctx = Context()
    a = ctx.new_tensor(Type.F32, (4, 3))
    with pytest.raises(TypeError, match="add_inplace"):
        ops.add_inplace(ctx, a)
    with pytest.raises(TypeError, match="rope_inplace"):
        ops.rope_inplace(ctx, a, a, 2, 0, 99)
    with pytest.raises(TypeError, match="base and impl must be callable"):
        inplace_variant(ops.add, None)


def _args_for(base: str, ctx: Context, a: Tensor, rng: np.random.Generator) -> tuple:
    """Valid extra arguments of ``base`` (after ctx, a) for a's shape."""
    ne = a.ne
    tile = tuple(int(rng.choice([1, n])) for n in ne)
    table = {
        "add": lambda: (ctx.new_tensor(Type.F32, tile),),
        "add1": lambda: (ctx.new_tensor(Type.F32, (1,)),),
        "scale": lambda: (float(rng.normal()),),
        "scale_bias": lambda: (float(rng.normal()), float(rng.normal())),
        "acc": lambda: (ctx.new_tensor(Type.F32, (ne[0], 1)), a.nb[1], a.nb[2], a.nb[3],
                        int(a.nb[1] * rng.integers(ne[1]))),
        "set_1d": lambda: (ctx.new_tensor(Type.F32, (ne[0],)), 0),
        "set_2d": lambda: (ctx.new_tensor(Type.F32, (ne[0], 1)), a.nb[1], 0),
        "norm": lambda: (1e-5,),
        "group_norm": lambda: (int(rng.integers(1, 4)), 1e-6),
        "diag_mask_inf": lambda: (int(rng.integers(0, 3)),),
        "soft_max": lambda: (),
        "soft_max_ext": lambda: (ctx.new_tensor(Type.F32, (ne[0], ne[1])), 0.5, 0.0),
        "rope": lambda: (ctx.new_tensor(Type.I32, (ne[2],)),
                         2 * int(rng.integers(0, ne[0] // 2 + 1)), int(rng.choice([0, 2]))),
        "rope_ext": lambda: (ctx.new_tensor(Type.I32, (ne[2],)), None, ne[0] - ne[0] % 2, 2, 0,
                             10000.0, 1.0, 0.0, 1.0, 32.0, 1.0),
        "unary": lambda: (UnaryOp(int(rng.choice([int(u) for u in UnaryOp]))),),
    }
    alias = {"sub": "add", "mul": "add", "div": "add", "set": "acc", "rms_norm": "norm",
             "l2_norm": "norm", "diag_mask_zero": "diag_mask_inf"}
    return table.get(alias.get(base, base), lambda: ())()


@pytest.mark.parametrize("name", TWINS)
def test_twin_builds_the_base_node_as_a_view(name: str) -> None:
    # randomized over shapes: the twin's node equals the base's node except for the view result
    rng = np.random.default_rng(zlib.crc32(name.encode()))  # per-name, same in every run
    base_name = name.removesuffix("_inplace")
    base, twin = getattr(ops, base_name), getattr(ops, name)
    for _ in range(5):
        ctx = Context()
        ne = tuple(int(v) for v in rng.integers(1, 5, size=4)) if base_name not in (
            "rope", "rope_ext") else (2 * int(rng.integers(1, 4)), 2, int(rng.integers(1, 4)), 1)
        a = ctx.new_tensor(Type.F32, ne)
        args = _args_for(base_name, ctx, a, rng)
        r0, r1 = base(ctx, a, *args), twin(ctx, a, *args)
        assert r1.view_src is a and r1.ne == a.ne and r1.nb == a.nb and r1.type == a.type
        assert r0.view_src is None and r0.ne == a.ne
        assert r1.op == r0.op and r1.src == r0.src and r1.src[0] is a
        if base_name in ("acc", "set", "set_1d", "set_2d"):
            assert r0.op_params[-1] == 0 and r1.op_params[-1] == 1
            assert r1.op_params[:-1] == r0.op_params[:-1]
        else:
            assert r1.op_params == r0.op_params


def test_twin_errors_name_the_twin() -> None:
    ctx = Context()
    a = ctx.new_tensor(Type.F32, (4, 3))
    with pytest.raises(ValueError, match="^add_inplace: requires b to tile a"):
        ops.add_inplace(ctx, a, ctx.new_tensor(Type.F32, (3,)))
    with pytest.raises(ValueError, match="^norm_inplace: requires eps >= 0"):
        ops.norm_inplace(ctx, a, -1.0)
    with pytest.raises(TypeError, match="^set_1d_inplace: b must be Tensor, got int 3"):
        ops.set_1d_inplace(ctx, a, 3, 0)


def test_docstrings_make_no_per_backend_type_support_claims() -> None:
    # support per backend and type lives in supports_op / the README table only (issue 15)
    for name in OPS_PUBLIC_BEFORE:
        doc = getattr(ops, name).__doc__ or ""
        for phrase in ("on the CPU", "CPU kernels", "CPU supports", "the CPU backend supports"):
            assert phrase not in doc, f"{name}: {phrase!r}"


def test_twin_accepts_keywords_and_applies_base_defaults() -> None:
    ctx = Context()
    a, b = ctx.new_tensor(Type.F32, (4, 3)), ctx.new_tensor(Type.F32, (4, 1))
    r = ops.add_inplace(ctx, b=b, a=a)  # the bind-by-signature path
    assert r.view_src is a and r.src == [a, b] and r.op == Op.ADD
    r = ops.rope_ext_inplace(ctx, ctx.new_tensor(Type.F32, (4, 2, 3)),
                             ctx.new_tensor(Type.I32, (3,)), None, 4, 2, 0, 10000.0, 1.0, 0.0,
                             1.0, 32.0, 1.0)
    assert r.op_params[:3] == [0, 4, 2] and r.op == Op.ROPE

    calls = []

    def base(ctx: Context, a: Tensor, k: int = 7) -> Tensor:
        """toy"""
        raise AssertionError("the twin must not call its base")

    def impl(ctx: Context, a: Tensor, k: int, inplace: bool, fn: str) -> Tensor:
        calls.append((k, inplace, fn))
        return a

    twin = inplace_variant(base, impl)
    assert twin(ctx, a) is a and twin(ctx, a, 3) is a and twin(ctx, a=a, k=5) is a
    assert calls == [(7, True, "base_inplace"), (3, True, "base_inplace"),
                     (5, True, "base_inplace")]
