"""Every public entry point checks its arguments' types and names the argument (issue 10, item 12).

One table: (call, expected exception, text the message must contain). Each row passes one wrong
argument with every other argument valid, so the row fails if that argument is not checked at
the entry point (before, several raised "'NoneType' object is not iterable" from deep inside).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ggmlpy.backend import registry
from ggmlpy.backend.interface import DeviceType
from ggmlpy.backends.cpu.backend import backend_cpu_init
from ggmlpy.backends.sim import register_sim_devices
from ggmlpy.core.check import (
    check_bool,
    check_int,
    check_number,
    check_optional,
    check_str,
    check_str_sequence,
    check_type,
)


def _runner():
    from ggmlpy.testops import runner

    return runner


def _cases():
    from ggmlpy.testops.families import all_cases

    return all_cases()[:3]


def _graph():
    from ggmlpy import ops
    from ggmlpy.core.graph import Graph
    from ggmlpy.core.tensor import Context
    from ggmlpy.core.types import Type

    ctx = Context(no_alloc=True)
    a = ctx.new_tensor(Type.F32, [4, 2]).set_name("a")
    out = ops.scale(ctx, a, 2.0)
    g = Graph()
    g.build_forward_expand(out)
    return g, {a: np.ones((2, 4), np.float32)}


def _compare(**kw):
    from ggmlpy.testops.divergence import compare_graph

    g, inputs = _graph()
    args = dict(graph=g, inputs=inputs, backend1=backend_cpu_init(), backend2=backend_cpu_init())
    args.update(kw)
    return compare_graph(**args)


def _load(**kw):
    from ggmlpy.models.bert import BertModel

    return BertModel.load(**kw)


def _encode(*a, **kw):
    from ggmlpy.models.bert import BertModel

    return BertModel.encode(BertModel.__new__(BertModel), *a, **kw)


def _encode_ids(*a, **kw):
    from ggmlpy.models.bert import BertModel

    return BertModel.encode_ids(BertModel.__new__(BertModel), *a, **kw)


def _token_ids(*a, **kw):
    from ggmlpy.models.bert import BertModel

    return BertModel.token_ids(BertModel.__new__(BertModel), *a, **kw)


def _loader(fn_name):
    def call(*a, **kw):
        from ggmlpy.models import loader

        return getattr(loader, fn_name)(*a, **kw)
    return call


def _cli(mod, fn):
    def call(*a):
        import importlib

        return getattr(importlib.import_module(mod), fn)(*a)
    return call


TABLE = [
    # registry
    ("reg_get('0')", lambda: registry.reg_get("0"), TypeError, "i must be int"),
    ("dev_get(None)", lambda: registry.dev_get(None), TypeError, "i must be int"),
    ("dev_get(True)", lambda: registry.dev_get(True), TypeError, "i must be int"),
    ("reg_by_name(None)", lambda: registry.reg_by_name(None), TypeError, "name must be str"),
    ("dev_by_name(3)", lambda: registry.dev_by_name(3), TypeError, "name must be str"),
    ("dev_by_type('GPU')", lambda: registry.dev_by_type("GPU"), TypeError, "type must be"),
    ("dev_by_type(99)", lambda: registry.dev_by_type(99), ValueError, "type must be a DeviceType"),
    ("unregister(None)", lambda: registry.unregister(None), TypeError, "name must be str"),
    ("register('x')", lambda: registry.register("x"), TypeError, "reg must be Reg"),
    ("backend_init_by_name(None)", lambda: registry.backend_init_by_name(None), TypeError,
     "name must be str"),
    ("backend_init_by_name(params=1)", lambda: registry.backend_init_by_name("CPU", 1), TypeError,
     "params must be str or None"),
    ("backend_init_by_type('CPU')", lambda: registry.backend_init_by_type("CPU"), TypeError,
     "type must be"),
    ("backend_init_by_type(params=[])",
     lambda: registry.backend_init_by_type(DeviceType.CPU, []), TypeError, "params must be"),
    ("register_sim_devices('2')", lambda: register_sim_devices("2"), TypeError,
     "n must be int"),
    ("register_sim_devices(0)", lambda: register_sim_devices(0), ValueError,
     "n must be in 1..64"),
    ("register_sim_devices(latency_us=nan)",
     lambda: register_sim_devices(1, latency_us=float("nan")), ValueError,
     "latency_us must be a finite number"),
    ("register_sim_devices(memory_mb=inf)",
     lambda: register_sim_devices(1, memory_mb=float("inf")), ValueError,
     "memory_mb must be a finite number"),
    ("register_sim_devices(memory_mb=0)",
     lambda: register_sim_devices(1, memory_mb=0), ValueError, "memory_mb must be > 0"),
    ("register_sim_devices(latency_us='1')",
     lambda: register_sim_devices(1, latency_us="1"), TypeError, "latency_us must be"),
    ("register_sim_devices(refuse_ops='ADD')",
     lambda: register_sim_devices(1, refuse_ops="ADD"), TypeError, "refuse_ops"),
    ("register_sim_devices(refuse_ops=[1])",
     lambda: register_sim_devices(1, refuse_ops=[1]), TypeError, "refuse_ops[0]"),
    ("register_sim_devices(latncy_us=1)",
     lambda: register_sim_devices(1, latncy_us=1), TypeError, "latncy_us"),
    ("excluded_by_backends_env(1)", lambda: registry.excluded_by_backends_env(1), TypeError,
     "name must be str"),
    # command lines called from Python
    ("cli.main('devices')", lambda: _cli("ggmlpy.cli", "main")("devices"), TypeError,
     "argv must be a sequence of str"),
    ("cli.main([1])", lambda: _cli("ggmlpy.cli", "main")([1]), TypeError, "argv[0] must be a str"),
    ("testops main('x')", lambda: _cli("ggmlpy.testops.cli", "main")("--list"), TypeError,
     "argv must be a sequence of str"),
    ("embed_main(None)", lambda: _cli("ggmlpy.models.cli", "embed_main")(None), TypeError,
     "argv must be a sequence of str"),
    ("download_main([None])", lambda: _cli("ggmlpy.models.cli", "download_main")([None]),
     TypeError, "argv[0] must be a str"),
    ("read_sentences(None)", lambda: _cli("ggmlpy.models.cli", "read_sentences")(None),
     TypeError, "path must be str"),
    # model loading
    ("check_model_dir(None)", lambda: _loader("check_model_dir")(None), TypeError,
     "model_dir must be str or Path"),
    ("load_config(3)", lambda: _loader("load_config")(3), TypeError, "model_dir must be"),
    ("load_weights(None)", lambda: _loader("load_weights")(None), TypeError, "model_dir must be"),
    ("load_tokenizer(None, 8)", lambda: _loader("load_tokenizer")(None, 8), TypeError,
     "model_dir must be"),
    ("load_tokenizer(dir, '8')", lambda: _loader("load_tokenizer")(".", "8"), TypeError,
     "max_seq_length must be int"),
    ("load_tokenizer(dir, 1)", lambda: _loader("load_tokenizer")(".", 1), ValueError,
     "max_seq_length must be >= 2"),
    ("load_tokenizer(lower_case='no')", lambda: _loader("load_tokenizer")(".", 8, "no"),
     TypeError, "lower_case must be bool"),
    ("BertConfig.from_model_dir(None)",
     lambda: __import__("ggmlpy.models.loader", fromlist=["x"]).BertConfig.from_model_dir(None),
     TypeError, "model_dir must be"),
    ("BertModel.load(model_dir=1)", lambda: _load(model_dir=1), TypeError, "model_dir must be"),
    ("BertModel.load(device=None)", lambda: _load(device=None), TypeError, "device must be"),
    ("BertModel.load(n_gpu_layers='2')", lambda: _load(n_gpu_layers="2"), TypeError,
     "n_gpu_layers must be int"),
    ("BertModel.load(n_gpu_layers=-2)", lambda: _load(n_gpu_layers=-2), ValueError,
     "n_gpu_layers must be >= -1"),
    ("BertModel.load(parallel=1)", lambda: _load(parallel=1), TypeError, "parallel must be bool"),
    ("BertModel.load(max_batch=0)", lambda: _load(max_batch=0), ValueError,
     "max_batch must be >= 1"),
    ("BertModel.load(max_batch=2.0)", lambda: _load(max_batch=2.0), TypeError,
     "max_batch must be int"),
    ("BertModel.load(op_offload='y')", lambda: _load(op_offload="y"), TypeError,
     "op_offload must be bool"),
    ("BertModel.encode(None)", lambda: _encode(None), TypeError, "sentences must be"),
    ("BertModel.encode(b'a')", lambda: _encode(b"a"), TypeError, "sentences must be"),
    ("BertModel.encode(truncate_dim='4')", lambda: _encode(["a"], truncate_dim="4"), TypeError,
     "truncate_dim"),
    ("BertModel.encode(batch_size='4')", lambda: _encode(["a"], batch_size="4"), TypeError,
     "batch_size must be int"),
    ("BertModel.encode(batch_size=True)", lambda: _encode(["a"], batch_size=True), TypeError,
     "batch_size must be int"),
    ("BertModel.encode(progress=None)", lambda: _encode(["a"], progress=None), TypeError,
     "progress must be bool"),
    ("BertModel.encode_ids(None)", lambda: _encode_ids(None), TypeError, "ids must be"),
    ("BertModel.encode_ids([None])", lambda: _encode_ids([None]), TypeError, "ids[0] must be"),
    ("BertModel.encode_ids([[1.5]])", lambda: _encode_ids([[101, 1.5]]), TypeError,
     "ids[0] must hold only ints"),
    ("BertModel.encode_ids(batch_size=1.0)", lambda: _encode_ids([[1]], batch_size=1.0),
     TypeError, "batch_size must be int"),
    ("BertModel.token_ids(None)", lambda: _token_ids(None), TypeError, "sentences must be"),
    # test-backend-ops from Python
    ("compare_graph(graph=None)", lambda: _compare(graph=None), TypeError, "graph must be Graph"),
    ("compare_graph(inputs=None)", lambda: _compare(inputs=None), TypeError,
     "inputs must be a mapping"),
    ("compare_graph(backend1='CPU')", lambda: _compare(backend1="CPU"), TypeError,
     "backend1 must be Backend"),
    ("compare_graph(backend2=None)", lambda: _compare(backend2=None), TypeError,
     "backend2 must be Backend"),
    ("compare_graph(tolerance='1')", lambda: _compare(tolerance="1"), TypeError,
     "tolerance must be"),
    ("compare_graph(tolerance=-1)", lambda: _compare(tolerance=-1.0), ValueError,
     "tolerance must be >= 0"),
    ("compare_graph(isolate=None)", lambda: _compare(isolate=None), TypeError,
     "isolate must be bool"),
    ("compare_graph(save_dir=1)", lambda: _compare(save_dir=1), TypeError, "save_dir must be"),
    # test-backend-ops runner
    ("select_cases(None)", lambda: _runner().select_cases(None), TypeError,
     "cases must be an iterable"),
    ("select_cases(cases=[1])", lambda: _runner().select_cases([1]), TypeError,
     "cases[0] must be TestCase"),
    ("select_cases(op=3)", lambda: _runner().select_cases(_cases(), op=3), TypeError,
     "op must be a sequence of str"),
    ("select_cases(params=3)", lambda: _runner().select_cases(_cases(), params=3), TypeError,
     "params must be"),
    ("run_tests(mode=1)", lambda: _runner().run_tests(mode=1), TypeError, "mode must be str"),
    ("run_tests(min_time='x')", lambda: _runner().run_tests(min_time="x"), TypeError,
     "min_time must be"),
    ("run_tests(min_time=-1)", lambda: _runner().run_tests(min_time=-1.0), ValueError,
     "min_time must be"),
    ("run_tests(min_runs=0)", lambda: _runner().run_tests(min_runs=0), ValueError,
     "min_runs must be"),
    ("run_tests(backend=3)", lambda: _runner().run_tests(backend=3, cases=[]), TypeError,
     "backend must be str, Backend or Device"),
    ("resolve_backends(3)", lambda: _runner().resolve_backends(3), TypeError,
     "backend must be str, Backend or Device"),
    ("resolve_backends([cpu, 3])", lambda: _runner().resolve_backends([backend_cpu_init(), 3]),
     TypeError, "backend[1] must be str, Backend or Device"),
]


@pytest.mark.parametrize("label, call, exc, needle", TABLE, ids=[r[0] for r in TABLE])
def test_wrong_argument_is_named(label, call, exc, needle):
    pytest.importorskip("tokenizers")
    with pytest.raises(exc) as ei:
        call()
    msg = str(ei.value)
    assert needle in msg, msg
    assert "\n" not in msg


# ---------------------------------------------------------------------------------------------
# the helpers themselves


@pytest.mark.parametrize("value, types, ok", [
    (1, int, True), (True, int, False), (True, bool, True), (True, (bool, int), True),
    (1.0, int, False), (None, (str, type(None)), True), ("x", (str, Path), True),
    (Path("."), (str, Path), True), (b"x", str, False),
])
def test_check_type(value, types, ok):
    if ok:
        assert check_type("arg", value, types, "f") is value
    else:
        with pytest.raises(TypeError, match=r"^f: arg must be "):
            check_type("arg", value, types, "f")


@pytest.mark.parametrize("value, lo, hi, exc", [
    (3, 0, 5, None), (np.int64(3), 0, 5, None), (0, 0, None, None), (5, None, 5, None),
    (-1, 0, 5, ValueError), (6, 0, 5, ValueError), (2.0, 0, 5, TypeError), (False, 0, 5, TypeError),
    ("3", 0, 5, TypeError), (None, 0, 5, TypeError),
])
def test_check_int(value, lo, hi, exc):
    if exc is None:
        r = check_int("n", value, lo, hi)
        assert r == int(value) and type(r) is int
    else:
        with pytest.raises(exc, match=r"n must be"):
            check_int("n", value, lo, hi)


@pytest.mark.parametrize("value, exc", [
    (1, None), (0.5, None), (np.float32(2.5), None), (0, ValueError), (float("nan"), ValueError),
    (float("inf"), ValueError), (-1.0, ValueError), (True, TypeError), ("1", TypeError),
])
def test_check_number_open_lower_bound(value, exc):
    if exc is None:
        assert check_number("x", value, 0.0, lo_open=True) == float(value)
    else:
        with pytest.raises(exc, match="x must be"):
            check_number("x", value, 0.0, lo_open=True)


def test_check_str_bool_optional_sequence():
    assert check_str("s", "a") == "a"
    with pytest.raises(ValueError, match="s must be a non-empty string"):
        check_str("s", "  ", nonempty=True)
    with pytest.raises(TypeError, match="b must be bool"):
        check_bool("b", 1)
    assert check_optional("o", None, int) is None
    with pytest.raises(TypeError, match="o must be int"):
        check_optional("o", "1", int)
    assert check_str_sequence("v", ("a", "b")) == ["a", "b"]
    with pytest.raises(TypeError, match=r"v must be a sequence of str"):
        check_str_sequence("v", "ab")
    with pytest.raises(TypeError, match=r"v\[1\] must be a str"):
        check_str_sequence("v", ["a", 2])


def test_message_stays_one_line_for_multiline_reprs():
    with pytest.raises(TypeError) as ei:
        check_type("x", np.zeros((5, 5)), int, "f")
    assert "\n" not in str(ei.value) and str(ei.value).startswith("f: x must be int, got ndarray ")


def test_index_getters_accept_numpy_integers():
    """reg_get/dev_get take any integer as the other int-taking entry points do (check_int): an
    index computed with NumPy is not a misuse; bool stays refused (table above)."""
    assert registry.reg_get(np.int64(0)) is registry.reg_get(0)
    last = registry.dev_count() - 1
    assert registry.dev_get(np.int32(last)) is registry.dev_get(last)
    with pytest.raises(IndexError, match="device index"):
        registry.dev_get(np.int64(registry.dev_count()))
