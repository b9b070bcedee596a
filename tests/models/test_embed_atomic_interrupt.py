"""Interrupted or failed writes leave no broken file (``convert`` GGUF, ``embed -o`` JSON/text/
.npy go to a temporary name in the target's folder and are renamed on success), and Ctrl-C at
any moment (an injected KeyboardInterrupt, a real SIGINT to a subprocess, SIGINT while the
package is still importing under ``python -m``) gives one line and exit status 130."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ggmlpy.cli import main as cli_main
from ggmlpy.models.atomic import atomic_path, write_text_atomic

ROOT = Path(__file__).resolve().parents[2]
EMB_MAX_ABS = 1e-5  # as tests/models/test_model_bert.py


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.parametrize("exc", [OSError("disk full"), KeyboardInterrupt()])
def test_atomic_path_keeps_the_old_file_on_failure(tmp_path, exc):
    target = tmp_path / "out.json"
    target.write_text("old")
    with pytest.raises(type(exc)):
        with atomic_path(target) as tmp:
            assert tmp.parent == tmp_path and tmp.name.startswith(".out.json.")
            tmp.write_text("half writ")
            raise exc
    assert target.read_text() == "old" and _leftovers(tmp_path) == []


def test_atomic_write_replaces_with_the_umask_mode(tmp_path):
    target = tmp_path / "o.txt"
    write_text_atomic(target, "new\n")
    assert target.read_text() == "new\n" and _leftovers(tmp_path) == []
    mask = os.umask(0)
    os.umask(mask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~mask


def test_convert_interrupted_while_writing_leaves_nothing(model_dir, tmp_path, monkeypatch, capsys):
    pytest.importorskip("gguf")
    from ggmlpy.gguf import weights

    def half_then_interrupt(path, *a, **kw):
        Path(path).write_bytes(b"GGUF" + b"\0" * 100)  # a partial file...
        raise KeyboardInterrupt  # ... and Ctrl-C

    monkeypatch.setattr(weights, "gguf_save", half_then_interrupt)
    out = tmp_path / "m.gguf"
    rc = cli_main(["convert", str(model_dir), "--type", "f16", "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 130 and err == "ggmlpy convert: interrupted\n"
    assert not out.exists() and _leftovers(tmp_path) == []


def test_convert_of_a_gguf_input_says_requantizing_is_unsupported(tmp_path, capsys):
    src = tmp_path / "in.gguf"
    src.write_bytes(b"GGUF")
    rc = cli_main(["convert", str(src), "--type", "q8_0", "-o", str(tmp_path / "o.gguf")])
    err = capsys.readouterr().err
    assert rc == 2 and "re-quantizing a GGUF file is not supported" in err
    assert len(err.strip().splitlines()) == 1


def test_embed_interrupted_keeps_the_old_output(model_dir, tmp_path, monkeypatch, capsys):
    from ggmlpy.models.bert import BertModel

    out = tmp_path / "emb.json"
    out.write_text("previous")

    def interrupted(self, *a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(BertModel, "encode_ids", interrupted)
    rc = cli_main(["embed", "--json", "-o", str(out), "a", "b"])
    err = capsys.readouterr().err
    assert rc == 130 and err == "ggmlpy embed: interrupted\n"
    assert out.read_text() == "previous" and _leftovers(tmp_path) == []


@pytest.mark.parametrize("name", ["emb.json", "emb.npy"])
def test_embed_output_file_holds_the_embeddings(model_dir, fixtures_dir, tmp_path, capsys, name):
    ref = json.loads((fixtures_dir / "minilm_public.json").read_text())
    out = tmp_path / name
    rc = cli_main(["embed", "--json", "--no-progress", "-o", str(out), *ref["sentences"][:2]])
    assert rc == 0 and capsys.readouterr().out == ""
    got = np.load(out) if name.endswith(".npy") else np.asarray(
        json.loads(out.read_text())["embeddings"])
    np.testing.assert_allclose(got, ref["embeddings"][:2], rtol=0, atol=EMB_MAX_ABS)
    assert _leftovers(tmp_path) == []


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GGMLPY_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_real_sigint_to_a_running_embed(model_dir, tmp_path):
    inp = tmp_path / "many.txt"
    inp.write_text("\n".join(f"sentence number {i} about nothing much" for i in range(20000)))
    out = tmp_path / "out.json"
    proc = subprocess.Popen([sys.executable, "-m", "ggmlpy", "embed", "--json", "--no-progress",
                             "--input", str(inp), "-o", str(out)], cwd=ROOT, env=_env(),
                            stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    time.sleep(4.0)  # started and busy (import, load or encode: each must answer the same)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert len(err.strip().splitlines()) == 1 and err.strip().endswith("interrupted"), err
    assert not out.exists() and _leftovers(tmp_path) == []


@pytest.mark.parametrize("delay", [3.0, 4.5])
def test_real_sigint_while_the_kernels_first_compile(model_dir, tmp_path, delay):
    # a copy of the package without its Numba cache: the signal lands in the first compilation
    # (a KeyboardInterrupt in llvmlite's object-cache callback used to be swallowed: the job ran
    # on, or failed with "no compiled object yet"); ggmlpy.core.sigint holds it until the
    # compiler returns
    pytest.importorskip("numba")
    copy = tmp_path / "src"
    shutil.copytree(ROOT / "ggmlpy", copy / "ggmlpy",
                    ignore=shutil.ignore_patterns("__pycache__"))
    inp = tmp_path / "many.txt"
    inp.write_text("\n".join(f"sentence number {i} about nothing much" for i in range(20000)))
    out = tmp_path / "out.json"
    env = _env()
    env["PYTHONPATH"] = str(copy) + os.pathsep + env["PYTHONPATH"]
    env.pop("NUMBA_CACHE_DIR", None)
    proc = subprocess.Popen([sys.executable, "-m", "ggmlpy", "embed", "--json", "--no-progress",
                             "--input", str(inp), "-o", str(out)], cwd=copy, env=env,
                            stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    time.sleep(delay)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == ["ggmlpy embed: interrupted"], err
    assert not out.exists()


def test_sigint_while_the_package_imports():
    # `python -m ggmlpy` as runpy runs it (the package is imported while sys.argv[0] is "-m"),
    # with a real SIGINT sent to the process the moment the package first imports NumPy
    code = (
        "import builtins, os, runpy, signal, sys\n"
        "sys.argv = ['-m', 'devices']\n"
        "real = builtins.__import__\n"
        "def hook(name, *a, **kw):\n"
        "    if name == 'numpy' and 'ggmlpy' in sys.modules:\n"
        "        builtins.__import__ = real\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "    return real(name, *a, **kw)\n"
        "builtins.__import__ = hook\n"
        "runpy.run_module('ggmlpy', run_name='__main__', alter_sys=True)\n"
        "print('not interrupted')\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 130, r.stderr
    assert r.stderr == "ggmlpy: interrupted\n" and r.stdout == ""
