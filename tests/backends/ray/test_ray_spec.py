"""The graph spec RAY devices receive (``ggmlpy.backends.ray.graph_spec``) and the RAY environment
variables (``ggmlpy.backends.ray.env``). Neither needs Ray: these run everywhere.

The spec test runs over the whole test-backend-ops case table, so every op and every kind of
``op_params`` slot the project knows is encoded, decoded and compared field by field with the
original tensors.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from ggmlpy import ops
from ggmlpy.alloc.tallocr import alloc_ctx_tensors_from_buft
from ggmlpy.backend.interface import tensor_buffer
from ggmlpy.backends.cpu.backend import cpu_buffer_type
from ggmlpy.backends.ray.env import ray_env
from ggmlpy.backends.ray.graph_spec import SPEC_VERSION, decode_spec, encode_graph, spec_hash
from ggmlpy.core import env
from ggmlpy.core.errors import NotAllocatedError
from ggmlpy.core.graph import Graph
from ggmlpy.core.opcodes import VIEW_OPS, Op
from ggmlpy.core.tensor import Context
from ggmlpy.core.types import Type
from ggmlpy.testops.families import all_cases


def _handles():
    table: dict[int, int] = {}

    def handle_of(t):
        return table.setdefault(id(tensor_buffer(t)), 100 + len(table))
    return handle_of


def _same_param(a, b) -> bool:
    if isinstance(a, (float, np.floating)) and np.isnan(a):
        return isinstance(b, type(b)) and np.isnan(b)
    return a == b and (type(b) is type(a) or (isinstance(a, int) and type(b) is int))


def test_roundtrip_over_every_case_of_the_op_table() -> None:
    cases = all_cases()
    assert len(cases) > 1000
    n_nodes = 0
    for case in cases:
        ctx, _, out = case.build_graph()
        g = Graph()
        g.build_forward_expand(out)
        if alloc_ctx_tensors_from_buft(ctx, cpu_buffer_type()) is None:
            continue
        handle_of = _handles()
        spec = encode_graph(g, handle_of)
        tensors, nodes = decode_spec(spec.data)
        want = [n for n in g.nodes if n.op != Op.NONE and n.op not in VIEW_OPS and not n.is_empty()]
        assert len(nodes) == len(want) == spec.n_nodes, case.name
        for n, w in zip(nodes, want):
            assert (n.op, n.type, n.ne, n.nb, n.offset, n.name) == (w.op, w.type, w.ne, w.nb,
                                                                    w.offset, w.name), case.name
            assert len(n.op_params) == len(w.op_params), case.name
            for pa, pb in zip(w.op_params, n.op_params):
                assert _same_param(pa if not isinstance(pa, Op) else int(pa), pb), \
                    (case.name, pa, pb, type(pa), type(pb))
            assert len(n.src) == len(w.src), case.name
            for s, ws in zip(n.src, g.node_srcs(w)):
                if ws is None:
                    assert s is None
                else:
                    assert (s.type, s.ne, s.nb, s.offset) == (ws.type, ws.ne, ws.nb, ws.offset)
        handle_by_tensor = {id(t): h for t, h in tensors}
        for n, w in zip(nodes, want):
            assert handle_by_tensor[id(n)] == handle_of(w)
        n_nodes += len(nodes)
    assert n_nodes > 1000


def _small_graph(offset_shift: int = 0):
    ctx = Context(no_alloc=True)
    a = ctx.new_tensor_2d(Type.F32, 8, 4).set_name("a")
    b = ops.scale(ctx, ops.soft_max_ext(ctx, a, None, 0.125, 0.0), 2.0).set_name("b")
    g = Graph()
    g.build_forward_expand(b)
    buf = cpu_buffer_type().alloc_buffer(4096)
    from ggmlpy.backend.interface import tensor_alloc

    base = 256 + offset_shift
    for i, t in enumerate(ctx):
        if t.view_src is None:
            tensor_alloc(buf, t, base + 512 * i)
    return g, a, b


def test_hash_names_the_content() -> None:
    g1, *_ = _small_graph()
    g2, *_ = _small_graph()
    g3, *_ = _small_graph(offset_shift=128)
    s1, s2, s3 = (encode_graph(g, lambda t: 7) for g in (g1, g2, g3))
    assert s1.hash == s2.hash == spec_hash(s1.data) and len(s1.hash) == 32
    assert s3.hash != s1.hash  # a moved tensor is another plan
    assert encode_graph(g1, lambda t: 8).hash != s1.hash  # another buffer too
    assert s1.handles == frozenset({7})


def test_float32_params_keep_their_type() -> None:
    g, a, b = _small_graph()
    b.op_params = [np.float32(0.1)]  # a float32 slot must come back float32, not float64
    _, nodes = decode_spec(encode_graph(g, lambda t: 1).data)
    p = nodes[-1].op_params[0]
    assert type(p) is np.float32 and p == np.float32(0.1)


def test_encode_errors() -> None:
    g, a, b = _small_graph()
    b.op_params = ["text"]
    with pytest.raises(TypeError, match="cannot be encoded"):
        encode_graph(g, lambda t: 1)
    ctx = Context(no_alloc=True)
    x = ctx.new_tensor_1d(Type.F32, 4).set_name("x")
    g2 = Graph()
    g2.build_forward_expand(ops.sqr(ctx, x))
    with pytest.raises(NotAllocatedError, match="'x' has no memory"):
        encode_graph(g2, lambda t: 1)


@pytest.mark.parametrize("data, needle", [
    (b"not json", "malformed"),
    (json.dumps({"v": SPEC_VERSION + 1, "tensors": [], "nodes": []}).encode(), "format version"),
    (json.dumps({"v": SPEC_VERSION, "tensors": [], "nodes": [[0, 1, [], []]]}).encode(), "malformed"),
    (json.dumps({"v": SPEC_VERSION, "tensors": [[0, [1, 1, 1, 1], [4, 4, 4, 4], 1, 0, "t"]],
                 "nodes": [[0, 1, [["x", 1]], []]]}).encode(), "malformed"),
])
def test_decode_rejects_bad_data(data: bytes, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        decode_spec(data)


# ---------------------------------------------------------------------------------------------
# environment (parsed in ggmlpy/core/env.py, combined with arguments in ggmlpy/backends/ray/env.py)


@pytest.mark.parametrize("value, want", [
    ("auto", "auto"), (" AUTO ", "auto"), ("10.0.0.5:6379", "10.0.0.5:6379"),
    ("head-node.local:6380", "head-node.local:6380"), ("[::1]:6379", "[::1]:6379"),
])
def test_address_accepted(value: str, want: str) -> None:
    assert env.parse_ray_address(value) == want


@pytest.mark.parametrize("value", ["", "host", "host:", "host:0", "host:70000", "a b:1",
                                   "ray://host:10001", "http://x:1"])
def test_address_rejected(value: str) -> None:
    with pytest.raises(env.EnvError, match="GGMLPY_RAY_ADDRESS=.* expected 'auto' or HOST:PORT"):
        env.parse_ray_address(value)


_RAY_VARS = (env.RAY_DEVICES, env.RAY_ADDRESS, env.RAY_TIMEOUT_S, env.RAY_CPUS,
             env.RAY_OBJECT_STORE_MB)


@pytest.mark.parametrize("values, requested, n, address", [
    ({}, False, 1, None),
    ({env.RAY_DEVICES: "0"}, False, 1, None),
    ({env.RAY_DEVICES: "3"}, True, 3, None),
    ({env.RAY_ADDRESS: "auto"}, True, None, "auto"),
    ({env.RAY_ADDRESS: "h:1", env.RAY_DEVICES: "2"}, True, 2, "h:1"),
    ({env.RAY_ADDRESS: "h:1", env.RAY_DEVICES: "0"}, False, None, "h:1"),
    ({env.RAY_DEVICES: "  "}, False, 1, None),  # blank is unset
])
def test_env_table(monkeypatch, values, requested, n, address) -> None:
    for k in _RAY_VARS:
        monkeypatch.delenv(k, raising=False)
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    env.validate()
    assert env.ray_requested() is requested
    e = ray_env()
    assert (e.n, e.address, e.timeout_s, e.num_cpus, e.object_store_mb) == (n, address, 120.0, 2, 512)


@pytest.mark.parametrize("name, value", [
    (env.RAY_DEVICES, "two"), (env.RAY_DEVICES, "-1"), (env.RAY_DEVICES, "1025"),
    (env.RAY_ADDRESS, "nohost"), (env.RAY_TIMEOUT_S, "0"), (env.RAY_TIMEOUT_S, "nan"),
    (env.RAY_TIMEOUT_S, "soon"), (env.RAY_CPUS, "0"), (env.RAY_OBJECT_STORE_MB, "10"),
])
def test_env_errors_name_the_variable(monkeypatch, name, value) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(env.EnvError, match=f"^{name}="):
        env.validate()


def test_ray_env_arguments_override(monkeypatch) -> None:
    for k in _RAY_VARS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv(env.RAY_TIMEOUT_S, "2.5")
    monkeypatch.setenv(env.RAY_CPUS, "3")
    e = ray_env(n=4, address="10.1.2.3:6379")
    assert (e.n, e.address, e.timeout_s, e.num_cpus) == (4, "10.1.2.3:6379", 2.5, 3)
    assert ray_env(timeout_s=7).timeout_s == 7.0
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        ray_env(timeout_s=0)
    with pytest.raises(ValueError, match="n must be"):
        ray_env(n=0)
    with pytest.raises(TypeError):
        ray_env(n="2")  # type: ignore[arg-type]
    with pytest.raises(env.EnvError, match="address="):
        ray_env(address="ray://x:1")
