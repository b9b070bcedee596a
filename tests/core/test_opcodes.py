"""ggml's numeric values for Op, UnaryOp and GluOp.

The tables below are ``enum ggml_op``, ``enum ggml_unary_op`` and ``enum ggml_glu_op`` of
``include/ggml.h`` in ggml-org/ggml at commit ``d99724f2`` (2026-08-21), the snapshot that
``shared/reference/ggml-ops-reference.md`` and ``ggml-backend-digest.md`` digest. Every entry is
listed in ggml's declaration order (the value is the position; ggml assigns no explicit numbers
except ``NONE = 0`` / ``ABS = 0`` / ``REGLU = 0``), including the ops ggmlpy does not implement, so
the test also checks that ggmlpy keeps their slots as gaps.
"""

from __future__ import annotations

import pytest

from ggmlpy.core.opcodes import INPLACE_CAPABLE_OPS, VIEW_OPS, GluOp, Op, UnaryOp

# enum ggml_op, declaration order (GGML_OP_ prefix dropped); GGML_OP_COUNT == len == 101
GGML_OP_ORDER = """
NONE DUP ADD ADD_ID ADD1 ACC SUB MUL DIV SQR SQRT LOG SIN COS SUM SUM_ROWS CUMSUM MEAN ARGMAX
COUNT_EQUAL REPEAT REPEAT_BACK CONCAT SILU_BACK NORM RMS_NORM RMS_NORM_BACK GROUP_NORM L2_NORM
MUL_MAT MUL_MAT_ID OUT_PROD SCALE SET CPY CONT RESHAPE VIEW PERMUTE TRANSPOSE GET_ROWS
GET_ROWS_BACK SET_ROWS DIAG DIAG_MASK_INF DIAG_MASK_ZERO SOFT_MAX SOFT_MAX_BACK ROPE ROPE_BACK
CLAMP CONV_TRANSPOSE_1D IM2COL IM2COL_BACK IM2COL_3D COL2IM_1D CONV_2D CONV_3D CONV_2D_DW
CONV_TRANSPOSE_2D POOL_1D POOL_2D POOL_2D_BACK UPSCALE PAD PAD_REFLECT_1D ROLL ARANGE
TIMESTEP_EMBEDDING ARGSORT TOP_K LEAKY_RELU TRI FILL FLASH_ATTN_EXT FLASH_ATTN_BACK SSM_CONV
SSM_SCAN WIN_PART WIN_UNPART GET_REL_POS ADD_REL_POS RWKV_WKV6 GATED_LINEAR_ATTN RWKV_WKV7
SOLVE_TRI GATED_DELTA_NET LIGHTNING_INDEXER DSV4_HC_COMB DSV4_HC_PRE DSV4_HC_POST UNARY
MAP_CUSTOM1 MAP_CUSTOM2 MAP_CUSTOM3 CUSTOM CROSS_ENTROPY_LOSS CROSS_ENTROPY_LOSS_BACK
OPT_STEP_ADAMW OPT_STEP_SGD GLU
""".split()

# enum ggml_unary_op (GGML_UNARY_OP_ prefix dropped); GGML_UNARY_OP_COUNT == 22
GGML_UNARY_OP_ORDER = """
ABS SGN NEG STEP TANH ELU RELU SIGMOID GELU GELU_QUICK SILU HARDSWISH HARDSIGMOID EXP EXPM1
SOFTPLUS GELU_ERF XIELU FLOOR CEIL ROUND TRUNC
""".split()

# enum ggml_glu_op (GGML_GLU_OP_ prefix dropped); GGML_GLU_OP_COUNT == 6
GGML_GLU_OP_ORDER = "REGLU GEGLU SWIGLU SWIGLU_OAI GEGLU_ERF GEGLU_QUICK".split()


def test_ggml_tables_have_the_digested_counts() -> None:
    # the counts the reference digest states for this snapshot (ggml-ops-reference.md, top)
    assert (len(GGML_OP_ORDER), len(GGML_UNARY_OP_ORDER), len(GGML_GLU_OP_ORDER)) == (101, 22, 6)


@pytest.mark.parametrize("enum, order", [(Op, GGML_OP_ORDER), (UnaryOp, GGML_UNARY_OP_ORDER),
                                         (GluOp, GGML_GLU_OP_ORDER)],
                         ids=["Op", "UnaryOp", "GluOp"])
def test_values_are_ggml_numbers(enum, order) -> None:
    for member in enum:
        assert member.name in order, f"{enum.__name__}.{member.name} is not a ggml name"
        assert int(member) == order.index(member.name), f"{enum.__name__}.{member.name}"


def test_known_values_from_issue_15() -> None:
    # the values the issue names, written out (not derived from the tables above)
    assert int(UnaryOp.GELU_ERF) == 16
    assert (int(GluOp.GEGLU_ERF), int(GluOp.GEGLU_QUICK)) == (4, 5)
    assert (int(Op.ADD1), int(Op.MUL_MAT), int(Op.UNARY), int(Op.GLU)) == (4, 29, 91, 100)


def test_unimplemented_ops_keep_their_slots_as_gaps() -> None:
    # ADD_ID (3), CUMSUM (16) and SWIGLU_OAI (3) are ggml ops ggmlpy does not implement
    with pytest.raises(ValueError):
        Op(3)
    with pytest.raises(ValueError):
        Op(16)
    with pytest.raises(ValueError):
        GluOp(3)
    assert Op(4) is Op.ADD1 and GluOp(4) is GluOp.GEGLU_ERF


def test_members_are_listed_in_value_order_and_sets_hold_members() -> None:
    for enum in (Op, UnaryOp, GluOp):
        values = [int(m) for m in enum]
        assert values == sorted(values) and len(set(values)) == len(values)
    assert all(isinstance(o, Op) for o in VIEW_OPS | INPLACE_CAPABLE_OPS)
