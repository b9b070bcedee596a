"""Device registry, backend initialisation and the `devices` CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import ggmlpy as gp
from ggmlpy import DeviceType
from ggmlpy.core.errors import BackendUnavailableError


def test_cpu_always_registered_and_last():
    devs = gp.devices()
    assert devs[-1].name == "CPU" and devs[-1].type == DeviceType.CPU
    assert gp.dev_by_name("cpu") is devs[-1]  # case-insensitive
    assert gp.dev_get(gp.dev_count() - 1) is devs[-1]
    with pytest.raises(IndexError):
        gp.dev_get(gp.dev_count())
    assert gp.dev_by_type(DeviceType.CPU) is devs[-1]
    props = devs[-1].get_props()
    assert props.memory_total > 0 and props.caps.buffer_from_host_ptr


def test_init_by_name_and_best():
    assert gp.backend_init_by_name("CPU").name == "CPU"
    assert gp.backend_init_by_type(DeviceType.CPU).name == "CPU"
    best = gp.backend_init_best()
    # no GPU on CI machines: the best backend is the CPU, never a SIM device
    if gp.dev_by_type(DeviceType.GPU) is None:
        assert best.name == "CPU"
    else:
        assert best.device.type == DeviceType.GPU


def test_unknown_and_missing_cuda_give_clear_errors():
    with pytest.raises(BackendUnavailableError, match="NOPE"):
        gp.backend_init_by_name("NOPE")
    if gp.dev_by_name("CUDA0") is None:
        with pytest.raises(BackendUnavailableError, match="CUDA0"):
            gp.backend_init_by_name("CUDA0")


def test_ggmlpy_backends_env_filters_and_orders(monkeypatch):
    monkeypatch.setenv("GGMLPY_BACKENDS", "CPU")
    assert [d.name for d in gp.devices()] == ["CPU"]
    monkeypatch.setenv("GGMLPY_BACKENDS", "NOTHING")
    assert [d.name for d in gp.devices()] == ["CPU"]  # the CPU is always kept, last


def _run_cli(*args, env_extra=None):
    import os

    env = dict(os.environ)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "ggmlpy", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_devices_cli_json_and_no_stderr():
    r = _run_cli("devices", "--json")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # a missing CUDA driver prints nothing to stderr
    data = json.loads(r.stdout)
    names = [d["name"] for d in data["devices"]]
    assert names[-1] == "CPU"
    if not any(n.startswith("CUDA") for n in names):
        assert data["cuda_unavailable"] and "\n" not in data["cuda_unavailable"]


def test_devices_cli_table_lists_sim_when_asked():
    r = _run_cli("devices", env_extra={"GGMLPY_SIM_DEVICES": "2"})
    assert r.returncode == 0, r.stderr
    assert "SIM0" in r.stdout and "SIM1" in r.stdout and "CPU" in r.stdout


def test_cli_unknown_command():
    r = _run_cli("frobnicate")
    assert r.returncode == 2 and "unknown command" in r.stderr


def test_factory_table_orders_regs_and_explains_missing_devices(fresh_registry, monkeypatch):
    from ggmlpy.backend.interface import Reg
    from ggmlpy.backend.registry import BackendFactory

    monkeypatch.delenv("GGMLPY_BACKENDS", raising=False)
    made = []

    def make_empty():
        made.append("EMPTY")
        return Reg("EMPTY", [], unavailable_reason="no empty hardware here")

    reg = fresh_registry
    reg.register_factory(BackendFactory("EMPTY", 5, make_empty))
    reg.register_factory(BackendFactory("TOY", 50, lambda: None,
                                        unavailable_reason=lambda name: f"{name} needs a toy"))
    try:
        assert not reg.initialized() and made == []
        names = [reg.reg_get(i).name for i in range(reg.reg_count())]
        assert reg.initialized() and made == ["EMPTY"]
        assert names[0] == "EMPTY" and names[-1] == "CPU" and "TOY" not in names
        assert [f.name for f in reg.factories()][:2] == ["EMPTY", "CUDA"]
        assert reg.reg_unavailable_reason("EMPTY") == "no empty hardware here"
        assert reg.reg_unavailable_reason("CPU") is None
        why = reg.device_unavailable_reason("toy3")
        assert why.startswith("no device named 'toy3' (TOY3 needs a toy); available: ")
        assert why.endswith("CPU")
        with pytest.raises(BackendUnavailableError, match="TOY0 needs a toy"):
            reg.backend_init_by_name("TOY0")
        reg.reset()
        assert not reg.initialized()
        reg.reg_count()
        assert made == ["EMPTY", "EMPTY"]  # a start-up after reset() calls the factories again
    finally:
        reg.unregister_factory("EMPTY")
        reg.unregister_factory("TOY")
    reg.reset()
    assert "EMPTY" not in [reg.reg_get(i).name for i in range(reg.reg_count())]
    with pytest.raises(ValueError, match="CPU"):
        reg.unregister_factory("cpu")


def test_reset_with_saved_regs_restores_them(fresh_registry):
    from ggmlpy.backends.sim import register_sim_devices

    reg = fresh_registry
    saved = [reg.reg_get(i) for i in range(reg.reg_count())]
    sim = register_sim_devices(1)
    assert reg.reg_by_name("SIM") is sim
    reg.reset(saved)
    assert reg.initialized() and [reg.reg_get(i) for i in range(reg.reg_count())] == saved
    with pytest.raises(ValueError, match="end with the CPU"):
        reg.reset(saved[:-1] + [sim])
    with pytest.raises(TypeError, match="regs\\[0\\]"):
        reg.reset(["CPU"])
