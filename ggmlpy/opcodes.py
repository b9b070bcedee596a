"""Operation codes: ggml's ``enum ggml_op``, ``enum ggml_unary_op`` and ``enum ggml_glu_op``.

Only the ops ggmlpy implements are listed. Values are ggmlpy's own (not ggml's numeric ids,
which change between ggml versions); names are ggml's without the ``GGML_OP_`` prefix.
"""

from __future__ import annotations

from enum import IntEnum, auto

__all__ = ["Op", "UnaryOp", "GluOp", "VIEW_OPS", "INPLACE_CAPABLE_OPS"]


class Op(IntEnum):
    """A tensor's operation (mirrors ``enum ggml_op``). ``NONE`` marks leaves and weights."""

    NONE = 0
    DUP = auto()
    ADD = auto()
    ADD1 = auto()
    ACC = auto()
    SUB = auto()
    MUL = auto()
    DIV = auto()
    SQR = auto()
    SQRT = auto()
    LOG = auto()
    SIN = auto()
    COS = auto()
    SUM = auto()
    SUM_ROWS = auto()
    MEAN = auto()
    ARGMAX = auto()
    REPEAT = auto()
    CONCAT = auto()
    NORM = auto()
    RMS_NORM = auto()
    GROUP_NORM = auto()
    L2_NORM = auto()
    MUL_MAT = auto()
    OUT_PROD = auto()
    SCALE = auto()
    SET = auto()
    CPY = auto()
    CONT = auto()
    RESHAPE = auto()
    VIEW = auto()
    PERMUTE = auto()
    TRANSPOSE = auto()
    GET_ROWS = auto()
    DIAG_MASK_INF = auto()
    DIAG_MASK_ZERO = auto()
    SOFT_MAX = auto()
    ROPE = auto()
    CLAMP = auto()
    ARANGE = auto()
    TIMESTEP_EMBEDDING = auto()
    ARGSORT = auto()
    LEAKY_RELU = auto()
    PAD = auto()
    FLASH_ATTN_EXT = auto()
    UNARY = auto()
    GLU = auto()

    @property
    def op_name(self) -> str:
        """ggml's upper-case name of the op (mirrors ``ggml_op_name``)."""
        return self.name


class UnaryOp(IntEnum):
    """The function of an ``Op.UNARY`` node, stored in ``op_params[0]`` (mirrors ``enum ggml_unary_op``)."""

    ABS = 0
    SGN = 1
    NEG = 2
    STEP = 3
    TANH = 4
    ELU = 5
    RELU = 6
    SIGMOID = 7
    GELU = 8
    GELU_QUICK = 9
    SILU = 10
    HARDSWISH = 11
    HARDSIGMOID = 12
    EXP = 13
    GELU_ERF = 14


class GluOp(IntEnum):
    """The activation of an ``Op.GLU`` node, stored in ``op_params[0]`` (mirrors ``enum ggml_glu_op``)."""

    REGLU = 0
    GEGLU = 1
    SWIGLU = 2
    GEGLU_ERF = 3
    GEGLU_QUICK = 4


#: Ops whose result aliases a source's memory by construction (mirrors ``ggml_op_is_view``
#: in ggml-alloc / ggml-backend: RESHAPE, VIEW, PERMUTE, TRANSPOSE). They compute nothing.
VIEW_OPS = frozenset({Op.RESHAPE, Op.VIEW, Op.PERMUTE, Op.TRANSPOSE})

#: Ops ggml-alloc may run in place in their first source's memory (mirrors ``ggml_op_can_inplace``).
INPLACE_CAPABLE_OPS = frozenset({
    Op.SCALE, Op.DIAG_MASK_ZERO, Op.DIAG_MASK_INF, Op.ADD, Op.ADD1, Op.SUB, Op.MUL, Op.DIV,
    Op.SQR, Op.SQRT, Op.LOG, Op.UNARY, Op.ROPE, Op.RMS_NORM, Op.SOFT_MAX,
})
