"""Graph-building op functions: ggml's ``ggml_<op>`` constructors with ggml's shape rules.

Every function takes the :class:`~ggmlpy.core.tensor.Context` first, then ggml's arguments in ggml's
order, e.g. ``ops.add(ctx, a, b)`` mirrors ``ggml_add(ctx, a, b)``. They only build metadata: the
result tensor (a new packed tensor via ``ctx.new_tensor``/``ctx.dup_tensor``, or a view via
``ctx.new_view``) with ``.op``, ``.op_params`` and ``.src`` set; nothing is computed and no memory
is touched. Backends compute the graph later.

Conventions used by every docstring:

* Shapes are ggml ``ne = [ne0, ne1, ne2, ne3]`` (element counts, ``ne0`` innermost); the NumPy
  shape of the same data is the reverse, ``(ne3, ne2, ne1, ne0)``. Strides ``nb`` are in bytes.
* ``op_params`` is a Python list in ggml's slot order (reference section 2.10). Float slots hold
  Python floats already rounded to float32 (ggml stores them bit-wise as float32), int slots hold
  Python ints. Ops without parameters have ``op_params == []``.
* ``src`` follows ggml's order. Optional sources keep their slot and hold ``None`` when absent
  (``soft_max`` ``[a, mask]``, ``rope`` ``[a, pos, freq_factors]``, ``flash_attn_ext``
  ``[q, k, v, mask]``).
* ``_inplace`` variants return a view of ``a`` (same type, ``ne``, ``nb``; ``view_src`` is a's root)
  with the same op and ``src[0] = a``.
* Names follow ggml where ggml names results: views ``"<a> (view)"``, ``"<a> (reshaped)"``,
  ``"<a> (permuted)"``, ``"<a> (transposed)"``, ``"<a> (cont)"``, ``"<a> (copy)"``,
  ``"<b> (copy of <a>)"``. Other results are unnamed (the graph names them ``node_%d``).
* Errors: a violated ggml assert raises ``ValueError`` (shape/layout/parameter rules) or
  ``TypeError`` (element-type rules), naming the function, the condition and the tensors (by
  ``.name``, type and ``ne``). Non-Tensor arguments raise ``TypeError``. Nothing is added to the
  context when an error is raised before the result is created.

* Which backend computes which op for which element types is stated in one place only: the
  kernel registry behind each backend's ``supports_op`` (``ggmlpy.backends.kernels``), from
  which the README's support table is generated (``scripts/gen_support_table.py``).
  The docstrings here state only the rules the constructors enforce.

Layout of the package (one module per test-backend-ops family, ``ggmlpy.testops.cases_*``):
:mod:`.elementwise` (dup, binary arithmetic, simple math, scale, clamp, leaky_relu),
:mod:`.activations` (UNARY and GLU), :mod:`.layout` (acc/set, reductions, copies, views, indexing,
pad, arange), :mod:`.nn` (norms, matrix products, masks, softmax, rope, attention) and
:mod:`._base` (constants, argument checks, tensor flag helpers). Every ``<op>_inplace`` twin is
generated from its base op by :func:`._variants.inplace_variant`; op families that differ only in
their op code (add/sub/mul/div, sqr..cos, the norms, the named UNARY and GLU functions) are built
from one table row each, and rules several ops share are written once
(:func:`._variants.shared_doc`). Every public op checks its arguments' types from its annotations
before any shape rule runs (``@checked_args`` at its definition, or applied by the generators of
:mod:`._variants`): ``TypeError`` naming the function and the argument (``"view_2d: ne1 must be
int, got str 'x'"``).

Note that ``sum``, ``abs`` and ``set`` shadow Python builtins inside this package's namespace (they
keep ggml's names); use ``ggmlpy.ops.sum`` qualified.
"""

from __future__ import annotations

from ggmlpy.ops._base import *  # noqa: F401,F403
from ggmlpy.ops.activations import *  # noqa: F401,F403
from ggmlpy.ops.elementwise import *  # noqa: F401,F403
from ggmlpy.ops.layout import *  # noqa: F401,F403
from ggmlpy.ops.nn import *  # noqa: F401,F403

__all__ = [
    # constants and enums
    "Prec", "SortOrder", "ROPE_TYPE_NORMAL", "ROPE_TYPE_NEOX",
    # tensor and graph helpers
    "set_name", "set_input", "set_output", "set_param", "build_forward_expand",
    # element-wise arithmetic
    "dup", "dup_inplace", "add", "add_inplace", "add1", "add1_inplace", "sub", "sub_inplace",
    "mul", "mul_inplace", "div", "div_inplace", "sqr", "sqr_inplace", "sqrt", "sqrt_inplace",
    "log", "log_inplace", "sin", "sin_inplace", "cos", "cos_inplace",
    "scale", "scale_inplace", "scale_bias", "scale_bias_inplace", "clamp", "leaky_relu",
    "acc", "acc_inplace", "set", "set_inplace", "set_1d", "set_1d_inplace", "set_2d",
    "set_2d_inplace",
    # reductions and index ops
    "sum", "sum_rows", "mean", "argmax", "argsort",
    # layout ops
    "repeat", "repeat_4d", "concat", "cpy", "cast", "cont", "cont_1d", "cont_2d", "cont_3d",
    "cont_4d", "reshape", "reshape_1d", "reshape_2d", "reshape_3d", "reshape_4d",
    "view_1d", "view_2d", "view_3d", "view_4d", "permute", "transpose", "get_rows", "set_rows",
    "pad", "pad_ext", "arange", "timestep_embedding",
    # normalisation
    "norm", "norm_inplace", "rms_norm", "rms_norm_inplace", "group_norm", "group_norm_inplace",
    "l2_norm", "l2_norm_inplace",
    # matrix products
    "mul_mat", "mul_mat_set_prec", "out_prod",
    # masking, softmax, attention, rope
    "diag_mask_inf", "diag_mask_inf_inplace", "diag_mask_zero", "diag_mask_zero_inplace",
    "soft_max", "soft_max_inplace", "soft_max_ext", "soft_max_ext_inplace",
    "rope", "rope_inplace", "rope_ext", "rope_ext_inplace",
    "flash_attn_ext", "flash_attn_ext_set_prec",
    # unary
    "unary", "unary_inplace",
    "abs", "abs_inplace", "sgn", "sgn_inplace", "neg", "neg_inplace", "step", "step_inplace",
    "tanh", "tanh_inplace", "elu", "elu_inplace", "relu", "relu_inplace",
    "sigmoid", "sigmoid_inplace", "gelu", "gelu_inplace", "gelu_quick", "gelu_quick_inplace",
    "gelu_erf", "gelu_erf_inplace", "silu", "silu_inplace", "hardswish", "hardsigmoid",
    "exp", "exp_inplace",
    # gated linear units
    "glu", "glu_split",
    "reglu", "reglu_swapped", "reglu_split", "geglu", "geglu_swapped", "geglu_split",
    "swiglu", "swiglu_swapped", "swiglu_split", "geglu_erf", "geglu_erf_swapped",
    "geglu_erf_split", "geglu_quick", "geglu_quick_swapped", "geglu_quick_split",
]

