"""Host-read fences (ggmlpy.backend.write_gen): a host region read in place by a queued copy is
not written before that copy completed, by any writer of the package."""

from __future__ import annotations

import numpy as np
import pytest
from backend_kinds import new_sim_devices

import ggmlpy as gp
from ggmlpy import Context, Type
from ggmlpy.alloc.tallocr import alloc_ctx_tensors_from_buft
from ggmlpy.backend.tensor_data import (
    backend_tensor_copy,
    backend_tensor_copy_async,
    backend_tensor_get,
    backend_tensor_memset,
    backend_tensor_set,
)
from ggmlpy.backend.write_gen import (
    host_read_queued,
    host_reads_pending,
    wait_host_reads,
    wait_host_reads_ranges,
)
from ggmlpy.backends.cpu.backend import cpu_buffer_type


class _Fence:
    """A fence completed by hand; counts the host's waits on it."""

    def __init__(self) -> None:
        self.completed = False
        self.waits = 0

    def wait(self) -> None:
        self.waits += 1
        self.completed = True

    def done(self) -> bool:
        return self.completed


def _buffer(size: int = 1024):
    return cpu_buffer_type().alloc_buffer(size)


def test_only_overlapping_writes_wait_and_completed_fences_are_dropped():
    buf = _buffer()
    f = _Fence()
    host_read_queued(buf, 100, 50, f.wait, f.done)  # bytes [100, 150)
    assert host_reads_pending()
    wait_host_reads(buf, 0, 100)       # ends where the read starts
    wait_host_reads(buf, 150, 10)      # starts where it ends
    assert f.waits == 0 and host_reads_pending()
    wait_host_reads(buf, 149, 1)       # the last byte read
    assert f.waits == 1
    wait_host_reads(buf, 100, 50)      # waited once: gone
    assert f.waits == 1 and not host_reads_pending()
    buf.free()


def test_whole_buffer_waits_for_every_fence():
    buf = _buffer()
    fs = [_Fence() for _ in range(3)]
    for i, f in enumerate(fs):
        host_read_queued(buf, 200 * i, 8, f.wait, f.done)
    buf.clear(0)  # Buffer.clear writes everything
    assert [f.waits for f in fs] == [1, 1, 1] and not host_reads_pending()
    g = _Fence()
    host_read_queued(buf, 0, 8, g.wait, g.done)
    buf.free()   # freed memory may be handed out again: wait first
    assert g.waits == 1 and not host_reads_pending()


@pytest.mark.parametrize("lo,hi,waits", [(0, 10, 0), (10, 20, 1), (35, 40, 0), (38, 45, 1),
                                         (60, 70, 0), (5, 100, 1), (29, 31, 1)])
def test_ranges_bisection(lo, hi, waits):
    # a plan writing [10, 30) and [40, 60) of one buffer
    buf = _buffer()
    f = _Fence()
    host_read_queued(buf, lo, hi - lo, f.wait, f.done)
    wait_host_reads_ranges({id(buf): (buf, [10, 40], [30, 60])})
    assert f.waits == waits
    f.completed = True
    wait_host_reads_ranges({})  # a completed fence of an unwritten buffer is dropped
    assert not host_reads_pending()
    buf.free()


def test_host_read_queued_refuses_a_non_buffer():
    f = _Fence()
    with pytest.raises(TypeError, match="must be a Buffer"):
        host_read_queued(np.zeros(4), 0, 4, f.wait, f.done)


def _sim_pair(latency_us: float):
    dev = new_sim_devices(1, latency_us=latency_us, pinned_direct_upload=True)[0]
    sim = dev.init_backend()
    hctx, dctx = Context(), Context()
    src = hctx.new_tensor_1d(Type.F32, 256).set_name("src")
    dst = dctx.new_tensor_1d(Type.F32, 256).set_name("dst")
    hbuf = alloc_ctx_tensors_from_buft(hctx, dev.get_host_buffer_type())
    dbuf = alloc_ctx_tensors_from_buft(dctx, dev.get_buffer_type())
    return sim, src, dst, hbuf, dbuf


@pytest.mark.parametrize("writer", ["set", "memset", "copy", "clear"])
def test_writer_of_pinned_source_waits_for_queued_upload(writer):
    sim, src, dst, hbuf, dbuf = _sim_pair(latency_us=3000)
    cpu = gp.backend_cpu_init()
    a = np.arange(256, dtype=np.float32)
    backend_tensor_set(src, a)
    backend_tensor_copy_async(cpu, sim, src, dst)  # queued on SIM, reads src in place
    assert host_reads_pending()
    if writer == "set":
        backend_tensor_set(src, np.full(256, -1.0, np.float32))
    elif writer == "memset":
        backend_tensor_memset(src, 0xFF, 16, 64)
    elif writer == "copy":
        octx = Context()
        o = octx.new_tensor_1d(Type.F32, 256)
        obuf = alloc_ctx_tensors_from_buft(octx, cpu_buffer_type())
        backend_tensor_set(o, np.full(256, 7.0, np.float32))
        backend_tensor_copy(o, src)
        obuf.free()
    else:
        hbuf.clear(0)
    sim.synchronize()
    # the upload saw the old bytes
    np.testing.assert_array_equal(backend_tensor_get(dst).reshape(-1), a)
    hbuf.free()
    dbuf.free()
