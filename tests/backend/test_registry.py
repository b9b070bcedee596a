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
