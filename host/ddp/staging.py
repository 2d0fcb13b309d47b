"""Getting tensors to the wire and back: zero-copy for CPU tensors, pinned host buffers
for device (CUDA) tensors, overlapped with the wire.

The switch client takes a float32 numpy vector. Every tensor is cut the same way into
*stage chunks* of ``chunk`` elements (a multiple of the job's elements per packet, so the
block exponents are those of one call), one ``SwitchClient.allreduce`` call each, so all
ranks make the same sequence of calls whatever device their tensors are on.

* CPU, contiguous float32: each chunk is a ``.numpy()`` view of the tensor; the result is
  written back into it in place (one copy, which the client's fresh result array needs
  anyway; AVG divides on that copy).
* CPU otherwise (fp16, bf16, any non-contiguous layout): one float32 contiguous copy
  (``contiguous_float32``), reduced as above, copied back with a cast through the
  tensor's own strides. A tensor in a graph (requires grad) is reduced detached: its
  values, in place, as Gloo does.
* A device tensor (``StagingDevice``): on the caller's thread, one device-to-host copy
  per chunk is queued on the device's copy stream, ordered after the work already queued
  on the tensor's stream (the gradient's producer), into a pinned host buffer. On the
  wire thread, chunk k goes out as soon as its copy event has fired, while chunks k+1..
  are still copying; its result is written into the same pinned buffer and copied back
  with a host-to-device copy queued on the tensor's stream, so whatever the caller
  queues on that stream afterwards sees the result. The pinned buffer returns to a pool
  once its last copy-back has completed.

``CudaDevice`` does this with CUDA streams and events. ``SimDevice`` does it on the CPU
with one thread per "stream" and a log of every copy, so the staging logic is tested
without a GPU (``tests/test_backend_staging.py``).
"""

import abc
from concurrent.futures import ThreadPoolExecutor
import threading
import time

import numpy as np
import torch

__all__ = ["StagingDevice", "CudaDevice", "SimDevice", "PinnedPool", "stage_chunks",
           "reduce_host", "contiguous_float32", "StagedCall"]


def stage_chunks(n: int, chunk: int):
    """The (start, stop) of each stage chunk of an ``n``-element tensor."""
    return [(a, min(a + chunk, n)) for a in range(0, n, chunk)] or [(0, 0)]


def _write_result(dst: np.ndarray, out: np.ndarray, divide: int):
    if divide > 1:
        np.divide(out, np.float32(divide), out=dst)
    else:
        np.copyto(dst, out)


def contiguous_float32(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values as a new contiguous float32 tensor on its device, outside any
    graph. (``t.to(torch.float32, memory_format=torch.contiguous_format)`` returns a
    float32 tensor itself, transposed or not, and ``.view(-1)`` on it then fails.)"""
    out = torch.empty(t.shape, dtype=torch.float32, device=t.device)
    return out.copy_(t.detach())


def reduce_host(flat: torch.Tensor, chunk: int, reduce, divide: int = 1):
    """Reduce a contiguous float32 CPU tensor in place, chunk by chunk: ``reduce(view)``
    takes a float32 numpy view and returns the sum (a new array). Zero-copy in."""
    arr = flat.numpy()
    for a, b in stage_chunks(arr.size, chunk):
        view = arr[a:b]
        _write_result(view, reduce(view), divide)


class PinnedPool:
    """Host buffers by element count, reused once the copy that reads them is done
    (``release(buf, event)``; ``event`` is waited on before the buffer is handed out
    again). Allocating pinned memory costs far more than a copy."""

    def __init__(self, device):
        self.device = device
        self._free = {}
        self._lock = threading.Lock()
        self.allocated = 0

    def acquire(self, n: int) -> torch.Tensor:
        with self._lock:
            free = self._free.get(n)
            item = free.pop() if free else None
        if item is not None:
            buf, event = item
            if event is not None:
                self.device.wait(event)
            return buf
        self.allocated += 1
        return self.device.host_buffer(n)

    def release(self, buf: torch.Tensor, event=None):
        with self._lock:
            self._free.setdefault(buf.numel(), []).append((buf, event))


class StagingDevice(abc.ABC):
    """What staging needs from an accelerator (an abstract interface: ``CudaDevice``
    implements it for CUDA, ``SimDevice`` on the CPU for the tests)."""
    type = "none"

    @abc.abstractmethod
    def stream_of(self, tensor):
        """The stream the caller queues work for ``tensor`` on."""

    @abc.abstractmethod
    def to_host(self, dst, src, after):
        """Queue a copy of device ``src`` into host ``dst`` on the copy stream, after the
        work queued on ``after``; return an event."""

    @abc.abstractmethod
    def to_device(self, dst, src, stream):
        """Queue a copy of host ``src`` into device ``dst`` on ``stream``; return an
        event."""

    @abc.abstractmethod
    def on_stream(self, stream, fn):
        """Run ``fn`` (which queues device work) on ``stream``; return an event after
        it."""

    @abc.abstractmethod
    def wait(self, event):
        """Block the host until ``event``."""

    @abc.abstractmethod
    def host_buffer(self, n):
        """A pinned float32 host tensor of ``n`` elements."""

    def future(self):
        """A ``torch.futures.Future`` that makes its waiters' streams wait for it."""
        return torch.futures.Future()

    def complete(self, fut, value, stream):
        fut.set_result(value)


class CudaDevice(StagingDevice):
    """One CUDA device: a copy stream for device-to-host copies, pinned host buffers,
    copies back on the tensor's own stream."""
    type = "cuda"

    def __init__(self, device):
        self.device = torch.device(device)
        self.copy_stream = torch.cuda.Stream(self.device)

    def stream_of(self, tensor):
        return torch.cuda.current_stream(tensor.device)

    def to_host(self, dst, src, after):
        self.copy_stream.wait_stream(after)
        with torch.cuda.stream(self.copy_stream):
            dst.copy_(src, non_blocking=True)
            src.record_stream(self.copy_stream)   # not freed while the copy reads it
            ev = torch.cuda.Event()
            ev.record(self.copy_stream)
        return ev

    def to_device(self, dst, src, stream):
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(stream)
        return ev

    def on_stream(self, stream, fn):
        with torch.cuda.stream(stream):
            fn()
            ev = torch.cuda.Event()
            ev.record(stream)
        return ev

    def wait(self, event):
        event.synchronize()

    def host_buffer(self, n):
        return torch.empty(n, dtype=torch.float32, pin_memory=True)

    def future(self):
        return torch.futures.Future(devices=[self.device])

    def complete(self, fut, value, stream):
        with torch.cuda.stream(stream):   # waiters' streams wait for this one
            fut.set_result(value)


class SimDevice(StagingDevice):
    """A CUDA-like device on the CPU, for tests: each stream is one worker thread (work
    on it runs in order), the copy stream is another; ``delay`` seconds per copy make
    overlap visible; ``log`` records (what, start, stop, thread) of every copy."""
    type = "sim"

    def __init__(self, delay: float = 0.0):
        self.delay = delay
        self.log = []
        self._streams = {}
        self._lock = threading.Lock()
        self.copy_stream = self.stream("copy")

    def stream(self, name="default"):
        with self._lock:
            s = self._streams.get(name)
            if s is None:
                s = self._streams[name] = ThreadPoolExecutor(1, thread_name_prefix=f"sim-{name}")
                s.name = name
            return s

    def stream_of(self, tensor):
        return self.stream("default")

    def _copy(self, what, dst, src):
        t0 = time.perf_counter()
        if self.delay:
            time.sleep(self.delay)
        dst.copy_(src)
        self.log.append((what, t0, time.perf_counter(), threading.current_thread().name))

    def to_host(self, dst, src, after):
        marker = after.submit(lambda: None)       # what was queued on `after` comes first
        return self.copy_stream.submit(lambda: (marker.result(), self._copy("d2h", dst, src)))

    def to_device(self, dst, src, stream):
        return stream.submit(self._copy, "h2d", dst, src)

    def on_stream(self, stream, fn):
        return stream.submit(fn)

    def wait(self, event):
        event.result()

    def complete(self, fut, value, stream):
        stream.submit(fut.set_result, value)   # after the copies queued on `stream`

    def host_buffer(self, n):
        return torch.empty(n, dtype=torch.float32)

    def synchronize(self):
        for s in list(self._streams.values()):
            s.submit(lambda: None).result()

    def close(self):
        for s in self._streams.values():
            s.shutdown(wait=True)


class StagedCall:
    """One allreduce of a device tensor through pinned host buffers.

    ``StagedCall(device, pool, tensor, chunk)`` runs on the caller's thread and queues
    every chunk's device-to-host copy; ``run(reduce, divide)`` runs on the wire thread:
    per chunk, wait for its copy, ``reduce(host_view) -> sum``, write the result (divided
    by ``divide``) into the pinned buffer, queue its copy back on the tensor's stream.
    fp16/bf16 and non-contiguous tensors are reduced through a float32 device copy, cast
    back on the tensor's stream at the end."""

    def __init__(self, device: StagingDevice, pool: PinnedPool, tensor: torch.Tensor,
                 chunk: int):
        self.device, self.pool, self.tensor = device, pool, tensor
        self.stream = device.stream_of(tensor)
        # on the caller's thread, whose current stream is the tensor's: a conversion
        # is queued behind the tensor's producer like any other work
        tensor = tensor.detach()    # the values (a bucket may be in a graph)
        self.tensor = tensor
        self.work = tensor if tensor.dtype == torch.float32 and tensor.is_contiguous() \
            else contiguous_float32(tensor)
        self.n = tensor.numel()
        self.chunks = stage_chunks(self.n, chunk)
        self.host = pool.acquire(self.n) if self.n else torch.empty(0)
        flat = self.work.view(-1)
        self.events = [device.to_host(self.host[a:b], flat[a:b], self.stream)
                       for a, b in self.chunks]

    def run(self, reduce, divide: int = 1):
        flat, host = self.work.view(-1), self.host
        last = None
        for (a, b), ev in zip(self.chunks, self.events):
            self.device.wait(ev)
            if b == a:
                continue
            view = host[a:b].numpy()
            _write_result(view, reduce(view), divide)
            last = self.device.to_device(flat[a:b], host[a:b], self.stream)
        if self.work is not self.tensor:
            work, tensor = self.work, self.tensor
            last = self.device.on_stream(self.stream,
                                         lambda: tensor.copy_(work.view(tensor.shape)))
        if self.n:
            self.pool.release(self.host, last)
        return last
