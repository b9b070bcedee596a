"""Write a file so that it is either complete or absent: the bytes go to a temporary name in
the target's folder, which is renamed over the target (``os.replace``, atomic on POSIX and
Windows within one file system) only once writing succeeded. A failure, an exception or Ctrl-C
(``KeyboardInterrupt``) at any moment removes the temporary file and leaves an existing target
untouched."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_path", "write_text_atomic"]


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` (``.NAME.XXXX.tmp``, same folder, so the rename
    stays on one file system); write the file there. On a normal exit it is renamed to
    ``path`` (replacing it); on any exception (``KeyboardInterrupt`` included) it is removed.

    Raises:
        OSError: the folder does not exist or is not writable (before anything is written), or
            the rename failed.
    """
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp",
                               dir=target.parent if str(target.parent) else ".")
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp_path, 0o666 & ~mask)  # mkstemp's 0600 -> what open() would have made
        os.replace(tmp_path, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp_path.unlink()
        raise


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through :func:`atomic_path`.

    Raises:
        OSError: as :func:`atomic_path`.
    """
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
