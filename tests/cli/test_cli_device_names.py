"""Device names and flags on the command lines (new-user pass): unknown names in GGMLPY_BACKENDS
are reported by ``devices`` in both outputs; a device GGMLPY_BACKENDS leaves out is refused
naming the variable by every command line; ``embed`` errors raised below the command line name
the flag the user typed, not the Python parameter; SIM devices named on a command line are
registered, and reported, once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ggmlpy.backend import registry
from ggmlpy.backends.sim import register_named_sim_devices, register_sim_devices
from ggmlpy.cli import main as cli_main
from ggmlpy.core import env

REPO = Path(__file__).resolve().parents[2]
_VARS = (env.BACKENDS, env.SIM_DEVICES, env.RAY_DEVICES, env.RAY_ADDRESS)


@pytest.fixture
def fresh(monkeypatch, fresh_registry):
    """No GGMLPY device variables and a registry started over for this test (the session's
    registry comes back afterwards), so SIM devices registered here do not leak."""
    for name in _VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


# ---------------------------------------------------------------------------------------------
# 1. devices: unknown GGMLPY_BACKENDS names in the table and in --json


@pytest.mark.parametrize("value, unknown", [("FOO", ["FOO"]), ("CPU,FOO,BAR7", ["FOO", "BAR7"]),
                                            ("SIM3,CPU", ["SIM3"]), ("CPU", [])])
@pytest.mark.parametrize("as_json", [False, True], ids=["table", "json"])
def test_devices_reports_unknown_backend_names(fresh, capsys, value, unknown, as_json):
    fresh.setenv(env.BACKENDS, value)
    assert cli_main(["devices"] + (["--json"] if as_json else [])) == 0
    out = capsys.readouterr().out
    if as_json:
        assert json.loads(out)["ignored_in_GGMLPY_BACKENDS"] == unknown
    else:
        lines = [ln for ln in out.splitlines() if ln.startswith("GGMLPY_BACKENDS:")]
        assert lines == ([f"GGMLPY_BACKENDS: no device named {', '.join(unknown)} (ignored)"]
                         if unknown else [])
        assert out.splitlines()[1].startswith("CPU ")  # the CPU is kept: the table's one row


# ---------------------------------------------------------------------------------------------
# a device left out by GGMLPY_BACKENDS: every command line names the variable

_EXCLUDED = [
    (["embed", "--device", "SIM0", "x"], "--device SIM0"),
    (["embed", "--device", "SIM0,SIM1", "x"], "--device SIM0"),
    (["test-backend-ops", "-b", "SIM3", "-o", "ADD"], "-b SIM3"),
    (["test-backend-ops", "-b", "SIM0,SIM1", "--list", "-o", "ADD"], "-b SIM0"),
]


@pytest.mark.parametrize("argv, flag", _EXCLUDED)
def test_excluded_device_names_the_variable(fresh, capsys, argv, flag):
    fresh.setenv(env.BACKENDS, "CPU")
    assert cli_main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert f"{flag}: " in err and "GGMLPY_BACKENDS=CPU leaves it out" in err
    assert "GGMLPY_SIM_DEVICES" not in err and "registered" not in err
    assert registry.reg_by_name("SIM") is None  # nothing registered in vain


def test_excluded_registered_device_and_unknown_name(fresh, capsys):
    register_sim_devices(1)
    fresh.setenv(env.BACKENDS, "CPU")
    assert cli_main(["embed", "--device", "SIM0", "x"]) == 2
    assert "GGMLPY_BACKENDS=CPU leaves it out" in capsys.readouterr().err
    # a name that is no device at all is not blamed on the variable
    assert cli_main(["embed", "--device", "FOO", "x"]) == 2
    err = capsys.readouterr().err
    assert "--device FOO: no device named 'FOO'" in err and "GGMLPY_BACKENDS" not in err


def test_bench_minilm_excluded_device_names_the_variable():
    e = {k: v for k, v in os.environ.items() if k not in _VARS}
    e[env.BACKENDS] = "CPU"
    e["PYTHONPATH"] = str(REPO) + os.pathsep + e.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_minilm.py"), "--device",
                        "SIM0", "--no-st"], capture_output=True, text=True, env=e, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    last = r.stderr.strip().splitlines()[-1]
    assert "--device SIM0: " in last and "GGMLPY_BACKENDS=CPU leaves it out" in last


@pytest.mark.parametrize("setup, name, needle", [
    ({}, "FOO", "no device named 'FOO'; available: CPU"),
    ({env.BACKENDS: "CPU"}, "SIM0", "GGMLPY_BACKENDS=CPU leaves it out"),
    ({env.BACKENDS: "CPU"}, "RAY1", "GGMLPY_BACKENDS=CPU leaves it out"),
    ({env.BACKENDS: "CPU"}, "FOO", "no device named 'FOO'; available: CPU"),
    ({}, "SIM64", "SIM devices are numbered SIM0..SIM63"),
    ({}, "SIM0", "GGMLPY_SIM_DEVICES=N or register_sim_devices()"),
    ({env.SIM_DEVICES: "1"}, "SIM1", "GGMLPY_SIM_DEVICES=1 registers SIM0 only"),
    ({env.SIM_DEVICES: "3"}, "SIM5", "GGMLPY_SIM_DEVICES=3 registers SIM0..SIM2 only"),
    ({}, "CUDA7", "no device named 'CUDA7' ("),
])
def test_device_unavailable_reason_table(fresh, setup, name, needle):
    for k, v in setup.items():
        fresh.setenv(k, v)
    why = registry.device_unavailable_reason(name)
    assert why is not None and needle in why and "\n" not in why
    assert registry.device_unavailable_reason("CPU") is None
    assert registry.device_unavailable_reason("cpu") is None


# ---------------------------------------------------------------------------------------------
# 2. embed: errors name the flag typed, never the Python parameter

_PARAMS = ("n_gpu_layers", "n_threads", "max_batch", "batch_size", "model_dir")
_BAD_FLAGS = [
    (["-t", "1000"], "-t/--threads"),
    (["--threads", "513"], "-t/--threads"),
    (["-t", "0"], "-t/--threads"),
    (["--batch-size", "0"], "--batch-size"),
    (["--batch-size", "abc"], "--batch-size"),
    (["-ngl", "-2"], "-ngl/--n-gpu-layers"),
    (["-ngl", "7", "--device", "SIM0"], "-ngl/--n-gpu-layers"),
    (["--n-gpu-layers", "99", "--device", "SIM0"], "-ngl/--n-gpu-layers"),
    (["-ngl", "x"], "-ngl"),
    (["--device", "FOO"], "--device FOO"),
    (["--device", "SIM99"], "--device SIM99"),
    (["--device", "SIM0,CPU"], "--device SIM0,CPU"),
    (["--device", "SIM0,sim0"], "--device SIM0,sim0"),
    (["--device", ""], "--device ''"),
    (["--device", "SIM0,,SIM1"], "--device 'SIM0,,SIM1'"),
    (["--model", "/definitely/not/here"], "--model"),
    (["--input", "/definitely/not/here.txt"], "--input"),
]


@pytest.mark.parametrize("argv, flag", _BAD_FLAGS)
def test_embed_bad_flag_values_name_the_flag(model_dir, fresh, capsys, argv, flag):
    assert cli_main(["embed", "--no-progress", *argv, "x"]) == 2
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if "registered" not in ln]  # SIM0's note
    assert out == "" and len(lines) == 1
    assert flag in lines[0]
    assert not any(p in lines[0] for p in _PARAMS), lines[0]


def test_every_param_flag_exists_in_the_parser():
    from ggmlpy.models import cli

    options = {o for a in cli._embed_parser()._actions for o in a.option_strings}
    for param, flags in cli._FLAG_OF_PARAM.items():
        for flag in flags.split("/"):
            assert flag in options, (param, flag)


# ---------------------------------------------------------------------------------------------
# 4. SIM devices named on a command line: registered once, one line


@pytest.mark.parametrize("argv, n", [
    (["embed", "--device", "SIM0,SIM1", "-ngl", "99", "x"], 2),
    (["embed", "--device", "SIM1,SIM0", "-ngl", "99", "x"], 2),
    (["embed", "--device", "SIM2", "-ngl", "99", "x"], 3),
    (["test-backend-ops", "-b", "SIM0,SIM1", "--list", "-o", "ADD"], 2),
    (["test-backend-ops", "-b", "SIM1,SIM0,CPU", "--list", "-o", "ADD"], 2),
    (["test-backend-ops", "-b", "SIM2", "--list", "-o", "ADD"], 3),
])
def test_sim_devices_registered_once(model_dir, fresh, capsys, argv, n):
    cli_main(argv)
    err = capsys.readouterr().err
    notes = [ln for ln in err.splitlines() if "host-emulated SIM device" in ln]
    assert len(notes) == 1 and f"registered {n} host-emulated SIM devices" in notes[0]
    assert [d.name for d in registry.reg_by_name("SIM").devices] == [f"SIM{i}" for i in range(n)]
    cli_main(argv)  # once per process: the devices exist now
    assert "host-emulated SIM device" not in capsys.readouterr().err


def test_sim_devices_from_env_print_nothing(model_dir, fresh, capsys):
    fresh.setenv(env.SIM_DEVICES, "2")
    assert cli_main(["embed", "--device", "SIM0,SIM1", "-ngl", "2", "--no-progress", "x"]) == 0
    out, err = capsys.readouterr()
    assert "host-emulated" not in err and "devices SIM0,SIM1,CPU" in out


@pytest.mark.parametrize("setup, names, n", [
    ({}, ["SIM0", "SIM1"], 2), ({}, ["SIM3", "SIM1"], 4), ({}, ["CPU"], 0), ({}, ["FOO"], 0),
    ({}, ["SIM64"], 0), ({env.SIM_DEVICES: "1"}, ["SIM3"], 0),
    ({env.BACKENDS: "CPU"}, ["SIM0"], 0), ({env.BACKENDS: "SIM0,CPU"}, ["SIM0", "SIM5"], 1),
])
def test_register_named_sim_devices_table(fresh, setup, names, n):
    for k, v in setup.items():
        fresh.setenv(k, v)
    assert register_named_sim_devices(names) == n
    assert register_named_sim_devices(names) == 0  # already there (or never)
    if n:
        assert [d.name for d in registry.reg_by_name("SIM").devices] == [f"SIM{i}" for i in range(n)]
