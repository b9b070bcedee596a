"""GGMLPY_* environment variables: every variable validated in one place,
a one-line error naming it, and a failed start-up that leaves no half-initialised registry."""

from __future__ import annotations

import pytest

from ggmlpy.backend import registry
from ggmlpy.backends.sim import register_sim_devices
from ggmlpy.core import env
from ggmlpy.core.errors import BackendUnavailableError

ALL = (env.BACKENDS, env.SIM_DEVICES, env.SIM_LATENCY_US, env.SIM_MEMORY_MB, env.SIM_PINNED_DIRECT,
       env.SCHED_DEBUG)


@pytest.fixture
def clean_env(monkeypatch):
    for name in ALL:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


BAD = [
    (env.SIM_LATENCY_US, "nan"), (env.SIM_LATENCY_US, "inf"), (env.SIM_LATENCY_US, "-inf"),
    (env.SIM_LATENCY_US, "-1"), (env.SIM_LATENCY_US, "fast"), (env.SIM_LATENCY_US, "1e400"),
    (env.SIM_MEMORY_MB, "nan"), (env.SIM_MEMORY_MB, "inf"), (env.SIM_MEMORY_MB, "0"),
    (env.SIM_MEMORY_MB, "-3"), (env.SIM_MEMORY_MB, "lots"),
    (env.SIM_DEVICES, "-2"), (env.SIM_DEVICES, "1.5"), (env.SIM_DEVICES, "two"),
    (env.SIM_DEVICES, "65"), (env.SIM_DEVICES, "nan"),
    (env.SCHED_DEBUG, "3"), (env.SCHED_DEBUG, "yes"), (env.SCHED_DEBUG, "-1"),
    (env.SIM_PINNED_DIRECT, "2"), (env.SIM_PINNED_DIRECT, "yes"), (env.SIM_PINNED_DIRECT, "true"),
    (env.BACKENDS, "SIM-0"), (env.BACKENDS, "SIM0,,CPU"), (env.BACKENDS, "0SIM"),
]


@pytest.mark.parametrize("name, value", BAD)
def test_bad_value_raises_one_line_naming_the_variable(clean_env, name, value):
    clean_env.setenv(name, value)
    with pytest.raises(env.EnvError) as ei:
        env.validate()
    msg = str(ei.value)
    assert ei.value.name == name and msg.startswith(f"{name}=") and repr(value) in msg
    assert "\n" not in msg and "expected" in msg
    assert isinstance(ei.value, ValueError)


GOOD = [
    (env.SIM_LATENCY_US, "0", env.sim_latency_us, 0.0),
    (env.SIM_LATENCY_US, " 1500 ", env.sim_latency_us, 1500.0),
    (env.SIM_LATENCY_US, "2.5e1", env.sim_latency_us, 25.0),
    (env.SIM_MEMORY_MB, "0.5", env.sim_memory_mb, 0.5),
    (env.SIM_MEMORY_MB, "3", env.sim_memory_mb, 3.0),
    (env.SIM_DEVICES, "0", env.sim_devices, 0),
    (env.SIM_DEVICES, "64", env.sim_devices, 64),
    (env.SCHED_DEBUG, "2", env.sched_debug, 2),
    (env.SIM_PINNED_DIRECT, "1", env.sim_pinned_direct, True),
    (env.SIM_PINNED_DIRECT, " 0 ", env.sim_pinned_direct, False),
    (env.BACKENDS, "sim0, cpu,SIM0", env.backends, ["SIM0", "CPU"]),
    (env.BACKENDS, "CUDA0", env.backends, ["CUDA0"]),
]


@pytest.mark.parametrize("name, value, read, expected", GOOD)
def test_good_values_parse(clean_env, name, value, read, expected):
    clean_env.setenv(name, value)
    env.validate()
    assert read() == expected


@pytest.mark.parametrize("value", ["", "   "])
def test_blank_means_unset(clean_env, value):
    for name in ALL:
        clean_env.setenv(name, value)
    env.validate()
    assert (env.backends(), env.sim_devices(), env.sim_latency_us(), env.sim_memory_mb(),
            env.sched_debug()) == (None, 0, None, None, 0)


def test_unknown_variables_listed(clean_env):
    clean_env.setenv("GGMLPY_SIMDEVICES", "2")
    assert "GGMLPY_SIMDEVICES" in env.unknown_variables()
    assert env.SIM_DEVICES not in env.unknown_variables()


def test_failed_start_leaves_no_half_state(clean_env, fresh_registry):
    # before: the CUDA reg was appended, the SIM parse failed, and the next call appended CUDA again
    clean_env.setenv(env.SIM_DEVICES, "x")
    for _ in range(2):
        with pytest.raises(env.EnvError, match="GGMLPY_SIM_DEVICES"):
            fresh_registry.devices()
        assert not fresh_registry.initialized()
    clean_env.setenv(env.SIM_DEVICES, "2")
    assert [d.name for d in fresh_registry.devices()][-3:] == ["SIM0", "SIM1", "CPU"]
    reg_names = [fresh_registry.reg_get(i).name for i in range(fresh_registry.reg_count())]
    assert reg_names == ["CUDA", "SIM", "CPU"]


@pytest.mark.parametrize("name, value", [(env.SIM_LATENCY_US, "nan"), (env.SIM_MEMORY_MB, "inf"),
                                         (env.SCHED_DEBUG, "9")])
def test_start_up_validates_every_variable(clean_env, fresh_registry, name, value):
    # even variables read only later (by sim_reg or the scheduler) stop the start-up at once
    clean_env.setenv(name, value)
    with pytest.raises(env.EnvError, match=name):
        fresh_registry.dev_count()
    assert not fresh_registry.initialized()


@pytest.mark.parametrize("name, value", [(env.SIM_LATENCY_US, "nan"), (env.SIM_MEMORY_MB, "inf"),
                                         (env.SIM_DEVICES, "-2"), (env.BACKENDS, "A B")])
def test_cli_bad_variable_exit_2_one_line(clean_env, capsys, name, value):
    from ggmlpy.cli import main

    clean_env.setenv(name, value)
    assert main(["devices"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"ggmlpy devices: {name}=")


def test_cli_warns_about_unknown_variable(clean_env, capsys):
    from ggmlpy.cli import main

    clean_env.setenv("GGMLPY_SIM_DEVICE", "1")
    assert main(["devices", "--json"]) == 0
    assert "GGMLPY_SIM_DEVICE is not a ggmlpy variable (ignored)" in capsys.readouterr().err


def test_sim_reg_reads_env_through_env_module(clean_env):
    from ggmlpy.backends.sim import sim_reg

    clean_env.setenv(env.SIM_LATENCY_US, "inf")
    with pytest.raises(env.EnvError, match="GGMLPY_SIM_LATENCY_US"):
        sim_reg(1)


def test_backends_env_exclusion_is_named_not_sim_devices(clean_env):
    register_sim_devices(1)
    clean_env.setenv(env.BACKENDS, "CPU")
    with pytest.raises(BackendUnavailableError) as ei:
        registry.backend_init_by_name("SIM0")
    assert "GGMLPY_BACKENDS=CPU leaves it out" in str(ei.value)
    assert "GGMLPY_SIM_DEVICES" not in str(ei.value)
    assert registry.excluded_by_backends_env("SIM0") and not registry.excluded_by_backends_env("CPU")


def test_embed_device_excluded_by_backends_env(clean_env, capsys):
    from ggmlpy.models.cli import embed_main

    clean_env.setenv(env.BACKENDS, "CPU")
    assert embed_main(["--device", "SIM0", "hello"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "GGMLPY_BACKENDS=CPU leaves it out" in err
    assert "GGMLPY_SIM_DEVICES" not in err


def test_test_backend_ops_backend_excluded_by_backends_env(clean_env, capsys):
    from ggmlpy.testops.cli import main

    clean_env.setenv(env.BACKENDS, "CPU")
    assert main(["-b", "SIM3", "-o", "ADD"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "GGMLPY_BACKENDS=CPU leaves it out" in err


def test_devices_usage_error_is_one_line():
    """`devices --bogus`: one line on stderr naming the command, exit 2 (README: one line)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "ggmlpy", "devices", "--bogus"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "ggmlpy devices: unrecognized arguments: --bogus (see --help)"]
