"""Ctrl-C while ``python -m ggmlpy`` is still importing the package: one line, exit status 130.

Python runs ``python -m ggmlpy`` by importing the package first; a ``KeyboardInterrupt`` raised
there would print a traceback of whichever import was running. While the package is being
located for ``-m``, ``sys.argv[0]`` is ``"-m"`` (documented for ``-m``); only then
:func:`install_startup_handler` installs a SIGINT handler that writes
``ggmlpy: interrupted`` and exits 130 at once (nothing is written to files during imports). The
command line (:func:`ggmlpy.cli.main`) gives SIGINT back to Python's ``KeyboardInterrupt`` as its
first step (:func:`restore_default`), so later interrupts unwind normally (temporary files
removed) and are reported by the command. ``import ggmlpy`` in a program leaves SIGINT alone.

A ``KeyboardInterrupt`` must not land inside Numba's compiler: llvmlite calls back into Python
from C while it writes the machine code (its object cache), where an exception is swallowed and
the half-made library is left behind (the interrupt is lost and the job runs on, or the next
step fails with ``RuntimeError: no compiled object yet``). :func:`deferring_handler` (the
command line's handler, and :func:`defer_in_compiler` for programs) therefore holds an
interrupt that arrives while the main thread is inside Numba or llvmlite and delivers it the
moment the main thread has left them (a watcher thread polls the main thread's stack every
10 ms and calls ``_thread.interrupt_main``).
"""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType

__all__ = ["install_startup_handler", "restore_default", "deferring_handler", "in_compiler",
           "defer_in_compiler"]

#: modules whose frames mark the main thread as inside the JIT compiler
_COMPILER_MODULES = ("numba", "llvmlite")
_pending = threading.Lock()  # held while a deferred interrupt waits for delivery


def _interrupted_at_start(signum: int, frame: object) -> None:
    os.write(2, b"ggmlpy: interrupted\n")
    os._exit(130)


def install_startup_handler() -> None:
    """Install the start-up SIGINT handler when the package is being located for
    ``python -m`` (``sys.argv[0] == "-m"``), from the main thread only; otherwise nothing."""
    if sys.argv[:1] != ["-m"]:
        return
    try:
        signal.signal(signal.SIGINT, _interrupted_at_start)
    except ValueError:  # not the main thread
        pass


def restore_default() -> None:
    """Put back a ``KeyboardInterrupt`` handler if the start-up one is installed: the
    :func:`deferring_handler`, which raises ``KeyboardInterrupt`` except inside the compiler."""
    if signal.getsignal(signal.SIGINT) is _interrupted_at_start:
        signal.signal(signal.SIGINT, deferring_handler)


def in_compiler(frame: FrameType | None) -> bool:
    """Whether ``frame`` or any frame below it on its stack runs code of Numba or llvmlite
    (by the module's ``__name__``)."""
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if isinstance(name, str) and name.split(".", 1)[0] in _COMPILER_MODULES:
            return True
        frame = frame.f_back
    return False


def _deliver_when_out(main_ident: int) -> None:
    try:
        while in_compiler(sys._current_frames().get(main_ident)):
            time.sleep(0.01)
    finally:
        _pending.release()
    _thread.interrupt_main(signal.SIGINT)


def deferring_handler(signum: int, frame: FrameType | None) -> None:
    """SIGINT handler (install with ``signal.signal(signal.SIGINT, deferring_handler)``, main
    thread only): raises ``KeyboardInterrupt`` as Python's default handler does, unless the main
    thread is inside Numba's compiler (:func:`in_compiler`); then the interrupt is held and
    raised as soon as the compiler returns (one held interrupt at a time; more are merged).

    Raises:
        KeyboardInterrupt: outside the compiler.
    """
    if not in_compiler(frame):
        raise KeyboardInterrupt
    if _pending.acquire(blocking=False):
        threading.Thread(target=_deliver_when_out, args=(threading.main_thread().ident,),
                         name="ggmlpy-sigint", daemon=True).start()


@contextlib.contextmanager
def defer_in_compiler() -> Iterator[None]:
    """Context manager for programs: :func:`deferring_handler` handles SIGINT inside the block
    (when SIGINT has Python's default handler and this is the main thread; otherwise nothing
    changes), the previous handler afterwards. *Sync*; nothing else is altered."""
    installed = threading.current_thread() is threading.main_thread() and \
        signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if installed:
        signal.signal(signal.SIGINT, deferring_handler)
    try:
        yield
    finally:
        if installed and signal.getsignal(signal.SIGINT) is deferring_handler:
            signal.signal(signal.SIGINT, signal.default_int_handler)
