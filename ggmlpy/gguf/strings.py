"""GGUF arrays of strings: located from their length prefixes, checked and decoded at once.

Each prefix's position depends on the previous length, so the prefixes are walked; runs of
strings shorter than 256 bytes are walked vectorised (:func:`_short_run`), others one by one.
The strings' bytes are then gathered with one NumPy mask and decoded as UTF-8 in one call; a
:class:`StringArray` slices single strings out of the decoded text on access.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import overload

import numpy as np

from ggmlpy.gguf.cursor import Cursor

__all__ = ["StringArray", "read_string_array"]


class StringArray(Sequence[str]):
    """A GGUF array of strings, decoded once (all UTF-8 checked at open), sliced on access.

    ``len(a)`` is the element count; ``a[i]`` the i-th string (negative indices count from the
    end; a slice gives a list); :meth:`tolist` all of them; :meth:`raw` one element's bytes.
    Equality with a list/tuple of str compares the strings.
    """

    __slots__ = ("_text", "_chars", "_bytes", "_blob")

    def __init__(self, text: str, char_bounds: np.ndarray, byte_bounds: np.ndarray,
                 blob: bytes) -> None:
        self._text = text
        self._chars = char_bounds  # n + 1 boundaries into text
        self._bytes = byte_bounds  # n + 1 boundaries into blob
        self._blob = blob

    def __len__(self) -> int:
        return len(self._chars) - 1

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        n = len(self)
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(n))]
        i = int(i)
        if not -n <= i < n:
            raise IndexError(f"StringArray index {i} out of range for {n} strings")
        i %= n
        return self._text[int(self._chars[i]):int(self._chars[i + 1])]

    def __iter__(self) -> Iterator[str]:
        return iter(self.tolist())

    def tolist(self) -> list[str]:
        """Every string, in order (one slice of the decoded text each)."""
        t, c = self._text, self._chars.tolist()
        return [t[a:b] for a, b in zip(c[:-1], c[1:])]

    def raw(self, i: int) -> bytes:
        """The UTF-8 bytes of element ``i``."""
        i = int(i) % len(self) if len(self) else int(i)
        return self._blob[int(self._bytes[i]):int(self._bytes[i + 1])]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StringArray):
            return self.tolist() == other.tolist()
        if isinstance(other, (list, tuple)):
            return self.tolist() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        head = ", ".join(repr(s) for s in self[:4])
        return f"StringArray({len(self)} strings: [{head}{', ...' if len(self) > 4 else ''}])"


def read_string_array(u8: np.ndarray, c: Cursor, name: str, n: int) -> StringArray:
    """The array of ``n`` strings at ``c.pos`` (its element type and count already read), as a
    :class:`StringArray`; ``name`` says which array in error messages. Leaves ``c.pos`` after it.

    Raises:
        GGUFError: a length past the end of the file, or bytes that are not UTF-8 (naming the
            element and its byte offset).
    """
    starts, lens = _string_offsets(u8, c, name, n)
    total = int(lens.sum()) if n else 0
    if n:
        # gather the string bytes (everything from the first length prefix to the end of the
        # last string, less the n 8-byte prefixes)
        first = int(starts[0]) - 8
        end = int(starts[-1] + lens[-1])
        keep = np.ones(end - first, bool)
        pref = starts - (8 + first)
        for k in range(8):
            keep[pref + k] = False
        blob_u8 = u8[first:end][keep]
        c.pos = end
    else:
        blob_u8 = np.zeros(0, np.uint8)
    blob = blob_u8.tobytes()
    bounds = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=bounds[1:])
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError as e:
        j = int(np.searchsorted(bounds, e.start, side="right")) - 1
        raise c.error(f"element {j} of {name} (at byte {int(starts[j])}) is not valid UTF-8 "
                      f"(byte {int(starts[j]) + e.start - int(bounds[j])})") from None
    if len(text) == total:  # ASCII: characters and bytes line up
        chars = bounds
    else:
        # a string starting with a continuation byte would decode as part of its neighbour
        head = blob_u8[bounds[:-1][lens > 0]]
        bad = np.flatnonzero((head & 0xC0) == 0x80)
        if len(bad):
            j = int(np.flatnonzero(lens > 0)[bad[0]])
            raise c.error(f"element {j} of {name} (at byte {int(starts[j])}) is not valid "
                          "UTF-8 (starts with a continuation byte)")
        lead = np.zeros(total + 1, np.int64)
        np.cumsum((blob_u8 & 0xC0) != 0x80, out=lead[1:])
        chars = lead[bounds]
    return StringArray(text, chars, bounds, blob)


def _string_offsets(u8: np.ndarray, c: Cursor, name: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(content start, length) of each of the ``n`` strings of an array at ``c.pos``, int64.

    Every length is checked against the bytes left. Each prefix's position depends on the
    previous length, so the prefixes are walked in runs: :func:`_short_run` takes a run of
    strings shorter than 256 bytes at once (vectorised), and a string it cannot take (a longer
    or an empty one, or one whose bytes look like a short prefix) is read the exact way, after
    which runs are tried again. Leaves ``c.pos`` at the end of the last string.
    """
    starts = np.empty(n, np.int64)
    lens = np.empty(n, np.int64)
    unpack = struct.Struct(c.order + "Q").unpack_from
    buf, size = c.buf, c.size
    j, p = 0, c.pos
    window = 1 << 12
    exact_until = 0  # after a short run, read this many strings the exact way before retrying
    while j < n:
        if n - j >= 64 and j >= exact_until:
            k, filled = _short_run(u8, c.order, p, n - j, size, window, starts[j:], lens[j:])
            if k:
                used = int(starts[j + k - 1] + lens[j + k - 1]) - p
                j += k
                p += used
                if k < 16:
                    exact_until = j + 64
                # a run that filled its window asks for a bigger one, a broken run for one about
                # its size; never much more than the rest needs at the mean length so far
                window = window * 4 if filled else max(1 << 12, 2 * used)
                window = min(window, (p - c.pos) * (n - j) // j * 5 // 4 + (1 << 12))
                continue
            exact_until = j + 64
        if p + 8 > size:
            raise c.error(f"truncated at byte {size} while reading the length of element {j} of "
                          f"{name} (at byte {p})")
        (ln,) = unpack(buf, p)
        p += 8
        if ln > size - p:
            raise c.error(f"element {j} of {name} declares {ln} bytes at byte {p}, but the file "
                          f"has {size - p} left")
        starts[j] = p
        lens[j] = ln
        p += ln
        j += 1
    c.pos = p
    return starts, lens


def _short_run(u8: np.ndarray, order: str, p: int, m: int, size: int, window: int,
               starts: np.ndarray, lens: np.ndarray) -> tuple[int, bool]:
    """Strings shorter than 256 bytes from byte ``p`` on, at most ``m`` of them, at once.

    The candidates are the positions in ``[p, p + window)`` whose 8-byte word (in the file's
    order) is below 256, found with one comparison per word for each of the 8 alignments. From
    ``p`` on, as long as each candidate's length leads exactly to the next candidate, that chain
    is the one the length prefixes define (it starts at a true prefix and each step follows the
    prefix), so its strings are taken; the run stops where the chain breaks.

    Returns:
        ``(strings taken, whether the run went on to the end of the window)``; writes their content starts and lengths into
        ``starts[:k]`` and ``lens[:k]``. ``k`` is 0 when ``p`` does not hold a length below 256.
    """
    end = min(size, p + min(window, 264 * m + 8))
    region = u8[p:end]
    nw = len(region)
    dt = np.dtype(order + "u8")
    parts = [np.flatnonzero(np.frombuffer(region, dt, count=(nw - a) // 8, offset=a) < 256) * 8 + a
             for a in range(min(8, nw - 7)) if nw - a >= 8]
    if not parts:
        return 0, False
    pos = np.sort(np.concatenate(parts))
    if not len(pos) or pos[0] != 0:
        return 0, False
    ln = region[pos + (0 if order == "<" else 7)].astype(np.int64)
    nxt = pos + 8 + ln
    brk = np.flatnonzero(nxt[:-1] != pos[1:])
    k = int(brk[0]) + 1 if len(brk) else len(pos)
    k = min(k, m)
    if int(nxt[k - 1]) > nw:  # the last string runs past the window (or the file)
        k -= 1
    if k <= 0:
        return 0, False
    starts[:k] = pos[:k] + 8 + p
    lens[:k] = ln[:k]
    return k, int(nxt[k - 1]) + 264 >= nw
