"""Operation codes: ggml's ``enum ggml_op``, ``enum ggml_unary_op`` and ``enum ggml_glu_op``.

Only the ops ggmlpy implements are listed, with **ggml's numeric values** as of ggml-org/ggml
``d99724f2`` (2026-08-21: ``GGML_OP_COUNT == 101``,
``GGML_UNARY_OP_COUNT == 22``, ``GGML_GLU_OP_COUNT == 6``), so that a node's op can be serialized
the way GGUF/RPC do. Ops ggmlpy does not implement keep their slot as a gap (e.g. no value 3,
ggml's ADD_ID). Names are ggml's without the ``GGML_OP_`` / ``GGML_UNARY_OP_`` / ``GGML_GLU_OP_``
prefix. ggml renumbers its enums between versions; ``tests/test_opcodes.py`` pins this version.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["Op", "UnaryOp", "GluOp", "VIEW_OPS", "INPLACE_CAPABLE_OPS"]


class Op(IntEnum):
    """A tensor's operation (mirrors ``enum ggml_op``). ``NONE`` marks leaves and weights."""

    NONE = 0
    DUP = 1
    ADD = 2
    ADD1 = 4
    ACC = 5
    SUB = 6
    MUL = 7
    DIV = 8
    SQR = 9
    SQRT = 10
    LOG = 11
    SIN = 12
    COS = 13
    SUM = 14
    SUM_ROWS = 15
    MEAN = 17
    ARGMAX = 18
    REPEAT = 20
    CONCAT = 22
    NORM = 24
    RMS_NORM = 25
    GROUP_NORM = 27
    L2_NORM = 28
    MUL_MAT = 29
    OUT_PROD = 31
    SCALE = 32
    SET = 33
    CPY = 34
    CONT = 35
    RESHAPE = 36
    VIEW = 37
    PERMUTE = 38
    TRANSPOSE = 39
    GET_ROWS = 40
    SET_ROWS = 42
    DIAG_MASK_INF = 44
    DIAG_MASK_ZERO = 45
    SOFT_MAX = 46
    ROPE = 48
    CLAMP = 50
    PAD = 64
    ARANGE = 67
    TIMESTEP_EMBEDDING = 68
    ARGSORT = 69
    LEAKY_RELU = 71
    FLASH_ATTN_EXT = 74
    UNARY = 91
    GLU = 100

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
    GELU_ERF = 16


class GluOp(IntEnum):
    """The activation of an ``Op.GLU`` node, stored in ``op_params[0]`` (mirrors ``enum ggml_glu_op``)."""

    REGLU = 0
    GEGLU = 1
    SWIGLU = 2
    GEGLU_ERF = 4
    GEGLU_QUICK = 5


#: Ops whose result aliases a source's memory by construction (mirrors ``ggml_op_is_view``
#: in ggml-alloc / ggml-backend: RESHAPE, VIEW, PERMUTE, TRANSPOSE). They compute nothing.
VIEW_OPS = frozenset({Op.RESHAPE, Op.VIEW, Op.PERMUTE, Op.TRANSPOSE})

#: Ops ggml-alloc may run in place in their first source's memory (mirrors ``ggml_op_can_inplace``).
INPLACE_CAPABLE_OPS = frozenset({
    Op.SCALE, Op.DIAG_MASK_ZERO, Op.DIAG_MASK_INF, Op.ADD, Op.ADD1, Op.SUB, Op.MUL, Op.DIV,
    Op.SQR, Op.SQRT, Op.LOG, Op.UNARY, Op.ROPE, Op.RMS_NORM, Op.SOFT_MAX,
})
