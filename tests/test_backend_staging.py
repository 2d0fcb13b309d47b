"""Staging device tensors through pinned host buffers, overlapped with the wire: the
logic on the CPU through ``SimDevice`` (a CUDA-like device with one thread per stream),
the backend end to end with it, and on a real GPU where there is one."""

import threading
import time

import pytest
import torch
import torch.distributed as dist

from ina_fabric.host.ddp.staging import SimDevice, PinnedPool, StagedCall, stage_chunks

pytestmark = pytest.mark.xdist_group("torch")


def wire(times, seconds=0.01, factor=3.0):
    """A fake switch call: sleeps like the wire, returns factor * x, records when."""
    def reduce(arr):
        t0 = time.perf_counter()
        time.sleep(seconds)
        times.append((t0, time.perf_counter(), threading.current_thread().name))
        return arr * factor
    return reduce


def test_chunks_cover_the_tensor():
    assert stage_chunks(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert stage_chunks(0, 4) == [(0, 0)]


def test_copy_of_chunk_k_plus_1_overlaps_chunk_k_on_the_wire():
    dev = SimDevice(delay=0.005)
    pool = PinnedPool(dev)
    x = torch.randn(8 * 100)
    t = x.clone()
    call = StagedCall(dev, pool, t, chunk=100)          # queues 8 copies to the host
    times = []
    last = call.run(wire(times), divide=2)
    dev.wait(last)
    assert torch.allclose(t, x * 1.5)
    d2h = [e for e in dev.log if e[0] == "d2h"]
    h2d = [e for e in dev.log if e[0] == "h2d"]
    assert len(d2h) == len(h2d) == len(times) == 8
    # the host copy of chunk k+1 was done before chunk k left the wire
    assert all(d2h[k + 1][2] <= times[k][1] for k in range(7))
    # copies to the host on the copy stream, back on the tensor's stream
    assert {e[3].split("_")[0] for e in d2h} == {"sim-copy"}
    assert {e[3].split("_")[0] for e in h2d} == {"sim-default"}
    assert pool.allocated == 1
    call2 = StagedCall(dev, pool, t, chunk=100)       # the pinned buffer is reused
    dev.wait(call2.run(wire([], 0.0), divide=1))
    assert pool.allocated == 1 and torch.allclose(t, x * 4.5)
    dev.close()


def test_copy_to_host_waits_for_work_queued_on_the_tensors_stream():
    dev = SimDevice()
    t = torch.zeros(50)
    stream = dev.stream_of(t)
    stream.submit(lambda: (time.sleep(0.05), t.fill_(2.0)))   # the gradient's producer
    call = StagedCall(dev, PinnedPool(dev), t, chunk=20)
    dev.wait(call.run(wire([], 0.0, 1.0)))
    assert torch.equal(t, torch.full((50,), 2.0))
    dev.close()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, "strided", "transposed",
                                   "permuted", "in-graph"])
def test_converted_and_strided_tensors_come_back_in_place(dtype):
    """(transposed, permuted: float32 tensors that ``to(float32, contiguous_format)``
    did not copy, "view size is not compatible"; in-graph: a non-leaf that requires
    grad, which the copy back refused)"""
    dev = SimDevice()
    if dtype == "strided":
        t = torch.arange(60.0).reshape(6, 10)[:, ::2]
    elif dtype == "transposed":
        t = torch.arange(60.0).reshape(6, 10).t()
    elif dtype == "permuted":
        t = torch.arange(60.0).reshape(3, 4, 5).permute(2, 0, 1)
    elif dtype == "in-graph":
        t = torch.arange(30.0).requires_grad_() * 1.0
    else:
        t = torch.arange(30.0).to(dtype)
    ref = t.detach().float() * 2
    call = StagedCall(dev, PinnedPool(dev), t, chunk=7)
    dev.wait(call.run(wire([], 0.0, 2.0)))
    assert torch.equal(t.detach().float(), ref)
    assert isinstance(dtype, str) or t.dtype == dtype
    dev.close()


def test_backend_all_reduce_through_the_staging_path(monkeypatch, ina_switch):
    from ina_fabric.distributed import InaOptions
    addr = ina_switch
    monkeypatch.setenv("INA_SWITCH", f"{addr[0]}:{addr[1]}")
    monkeypatch.setenv("INA_ELEMENTS", "256")
    for k in ("INA_JOB", "INA_STATIC_JOB", "INA_FALLBACK", "INA_DTYPES"):
        monkeypatch.delenv(k, raising=False)
    try:
        dist.init_process_group("ina", store=dist.HashStore(), rank=0, world_size=1,
                                pg_options=InaOptions(device="sim", stage_bytes=4096))
        pg = dist.distributed_c10d._get_default_group()
        x = torch.randn(3000)
        t = x.clone()
        work = dist.all_reduce(t, async_op=True)
        assert work.get_future().wait()[0] is t
        assert torch.allclose(t, x, atol=1e-5) and pg.state.stats.calls == 3
        sim = pg._devices["sim"]
        assert [e[0] for e in sim.log].count("d2h") == 3
        assert [e[0] for e in sim.log].count("h2d") == 3
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4))
        model(torch.randn(5, 8)).sum().backward()
        assert pg.state.stats.calls == 4
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA device here (torch.cuda.is_available() is False); the "
                           "staging logic is tested on the CPU through SimDevice above")
def test_cuda_tensors_through_pinned_buffers(monkeypatch, ina_switch):
    from ina_fabric.distributed import InaOptions
    addr = ina_switch
    monkeypatch.setenv("INA_SWITCH", f"{addr[0]}:{addr[1]}")
    monkeypatch.setenv("INA_ELEMENTS", "8192")
    try:
        dist.init_process_group("ina", store=dist.HashStore(), rank=0, world_size=1,
                                pg_options=InaOptions(stage_bytes=4 << 20))
        pg = dist.distributed_c10d._get_default_group()
        x = torch.randn(3_000_000, device="cuda")
        t = x * 1.0                       # queued on the current stream, not yet done
        dist.all_reduce(t)                # 4 MiB stage chunks: 3 switch calls
        assert torch.allclose(t, x, atol=1e-5) and pg.state.stats.calls == 3
        for make in (lambda b: b.t(), lambda b: b[:, ::2]):   # other layouts, in place
            base = torch.randn(64, 48, device="cuda")
            keep = base.clone()
            dist.all_reduce(make(base))
            assert torch.allclose(base, keep, atol=1e-5)
        w = torch.randn(100, device="cuda", requires_grad=True)
        y = w * 2                         # a non-leaf in a graph: its values, detached
        dist.all_reduce(y)
        assert y.requires_grad and torch.allclose(y.detach(), w.detach() * 2, atol=1e-5)
        calls = pg.state.stats.calls
        s = torch.sparse_coo_tensor(torch.tensor([[1, 5]]), torch.ones(2), (8,)).cuda()
        try:                              # sparse: Gloo (when it carries sparse CUDA)
            dist.all_reduce(s)
        except RuntimeError as e:
            assert "sparse" in str(e).lower() or "not supported" in str(e).lower(), e
        assert pg.state.stats.calls == calls
        h = torch.randn(1000, device="cuda", dtype=torch.float16)
        g = h.clone()
        dist.all_reduce(g, op=dist.ReduceOp.AVG)
        assert g.dtype == torch.float16 and torch.equal(g, h)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 8).cuda())
        model(torch.randn(16, 64, device="cuda")).sum().backward()
        torch.cuda.synchronize()
        assert pg.state.stats.calls >= calls + 2
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
