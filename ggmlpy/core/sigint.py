"""Ctrl-C while ``python -m ggmlpy`` is still importing the package: one line, exit status 130.

Python runs ``python -m ggmlpy`` by importing the package first; a ``KeyboardInterrupt`` raised
there would print a traceback of whichever import was running. While the package is being
located for ``-m``, ``sys.argv[0]`` is ``"-m"`` (documented for ``-m``); only then
:func:`install_startup_handler` installs a SIGINT handler that writes
``ggmlpy: interrupted`` and exits 130 at once (nothing is written to files during imports). The
command line (:func:`ggmlpy.cli.main`) gives SIGINT back to Python's ``KeyboardInterrupt`` as its
first step (:func:`restore_default`), so later interrupts unwind normally (temporary files
removed) and are reported by the command. ``import ggmlpy`` in a program leaves SIGINT alone.
"""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["install_startup_handler", "restore_default"]


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
    """Put back Python's ``KeyboardInterrupt`` handler if the start-up one is installed."""
    if signal.getsignal(signal.SIGINT) is _interrupted_at_start:
        signal.signal(signal.SIGINT, signal.default_int_handler)
