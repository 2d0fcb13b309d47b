"""What the ``ina`` backend takes besides a plain float32 vector (issue 44's table): every
layout (transposed, permuted, strided views), tensors in a graph (a non-leaf that requires
grad; DDP's buckets under ``backward(create_graph=True)``), sparse tensors (to Gloo), and
``monitored_barrier`` (torch refuses it for a backend not named gloo). Two ranks are two
threads of this process on one HashStore, each with its own ``ProcessGroupIna`` (real
sockets, the module's software switch), compared with the exact sums."""

import datetime
import os
import pathlib
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from ina_fabric.distributed import InaOptions, ProcessGroupIna

pytestmark = pytest.mark.xdist_group("torch")

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture
def env(monkeypatch, ina_switch):
    for k in ("INA_FALLBACK", "INA_DTYPES", "INA_STATIC_JOB", "INA_PORT", "INA_JOB",
              "INA_SESSION", "INA_MODE", "INA_TAKEOVER"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("INA_SWITCH", f"{ina_switch[0]}:{ina_switch[1]}")
    monkeypatch.setenv("INA_ELEMENTS", "256")
    return ina_switch


_jobs = iter(range(300, 400))


def two_ranks(body, world=2, **options):
    """Run ``body(pg, rank)`` on ``world`` ranks (threads, one store, one job); their
    return values, by rank. Any rank's error is raised."""
    from conftest import run_threads
    store, out = dist.HashStore(), {}
    job = next(_jobs)

    def rank(r):
        pg = None
        try:
            pg = ProcessGroupIna(store, r, world, datetime.timedelta(seconds=30),
                                 InaOptions(job=job, **options))
            out[r] = body(pg, r)
        finally:
            if pg is not None:
                pg.shutdown()
    errs = run_threads(rank, range(world))
    if errs:
        raise errs[0]
    return out


def data(r, shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed * 10 + r))


ATOL = 1e-4     # the switch's fixed point (block exponents): far below this here


LAYOUTS = {"t": ((6, 8), lambda b: b.t()),
           "permute": ((3, 4, 5), lambda b: b.permute(2, 0, 1)),
           "transpose-slice": ((3, 4, 5), lambda b: b.transpose(0, 1)[1:]),
           "strided": ((6, 8), lambda b: b[:, ::2])}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_any_layout_is_summed_in_place(env, layout):
    """A transposed or permuted float32 tensor raised "view size is not compatible":
    ``to(float32, memory_format=contiguous_format)`` does not copy a float32 tensor.
    Around a strided view, nothing outside it is written (Gloo wrote there)."""
    shape, make = LAYOUTS[layout]

    def body(pg, r):
        base = data(r, shape)
        keep = base.clone()
        pg.allreduce([make(base)]).wait()
        return keep, base

    out = two_ranks(body)
    total = make(out[0][0]) + make(out[1][0])
    for r in range(2):
        keep, base = out[r]
        got = make(base)
        assert torch.allclose(got, total, atol=ATOL), (got - total).abs().max()
        outside = torch.ones_like(base, dtype=torch.bool)
        make(outside).fill_(False)
        assert torch.equal(base[outside], keep[outside])     # untouched


def test_a_tensor_that_requires_grad_is_summed_detached(env):
    """A non-leaf float32 tensor that requires grad raised "Can't call numpy() on Tensor
    that requires grad"; it is reduced in place, as Gloo does, and stays in its graph."""
    def body(pg, r):
        w = data(r, (100,)).requires_grad_()
        y = w * 2                      # a non-leaf in a graph
        pg.allreduce([y]).wait()
        return w.detach(), y
    out = two_ranks(body)
    total = 2 * (out[0][0] + out[1][0])
    for r in range(2):
        y = out[r][1]
        assert y.requires_grad and y.grad_fn is not None
        assert torch.allclose(y.detach(), total, atol=ATOL)


def test_sparse_goes_to_gloo(env):
    """A sparse tensor went to the switch path (the routing checked dtype and device,
    not layout) and raised NotImplementedError for SparseCPU."""
    def body(pg, r):
        i = torch.tensor([[0, 3 + r]])
        s = torch.sparse_coo_tensor(i, torch.tensor([1.0 + r, 2.0]), (8,))
        w = pg.allreduce([s])
        w.wait()
        return w.result()[0].to_dense(), pg.state.stats.calls
    out = two_ranks(body)
    want = torch.tensor([3.0, 0, 0, 2, 2, 0, 0, 0])
    for r in range(2):
        assert torch.equal(out[r][0], want) and out[r][1] == 0


def test_monitored_barrier_on_the_inner_gloo_group(env):
    """``dist.monitored_barrier`` refuses a group whose backend is not named gloo
    (torch's own check: "monitored_barrier is only implemented for GLOO backend");
    ``ina_fabric.distributed.monitored_barrier`` runs it on the group's Gloo, and
    names the rank that did not come."""
    from ina_fabric.distributed import monitored_barrier

    def body(pg, r):
        monitored_barrier(pg, timeout=datetime.timedelta(seconds=20))
        if r == 0:
            try:
                monitored_barrier(pg, timeout=datetime.timedelta(seconds=1))
            except RuntimeError as e:
                return str(e)
        return None
    out = two_ranks(body)
    assert "Rank 1 failed to pass monitoredBarrier" in out[0], out


DDP_CREATE_GRAPH = r"""
import torch, torch.distributed as dist
import ina_fabric.distributed
dist.init_process_group("ina", store=dist.HashStore(), rank=0, world_size=1)
class Model(torch.nn.Module):          # as upstream's test_ddp_create_graph
    def __init__(self):
        super().__init__()
        self.p = torch.nn.Parameter(torch.tensor(1.0))
    def forward(self):
        return self.p.pow(2)
ddp = torch.nn.parallel.DistributedDataParallel(Model())
for _ in range(6):
    ddp().backward(create_graph=True)
    assert all(p.requires_grad for p in ddp.parameters())
pg = dist.distributed_c10d._get_default_group()
assert pg.state.stats.calls >= 6, pg.state.stats.calls
g = ddp.module.p.grad
assert g.requires_grad and abs(float(g) - 12.0) < 1e-4, g     # 6 x d(p^2)/dp at p = 1
dist.destroy_process_group()
print("ok")
"""


def test_ddp_backward_with_create_graph(env):
    """DDP with ``backward(create_graph=True)``: the bucket requires grad, the wire
    thread raised on ``.numpy()`` and the DDP reducer then crashed the process (SIGSEGV,
    as in upstream's ``test_ddp_create_graph``); in a subprocess so a crash is a
    failure, not the end of the test run."""
    e = {**os.environ, "INA_JOB": str(next(_jobs)), "OMP_NUM_THREADS": "1",
         "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    p = subprocess.run([sys.executable, "-c", DDP_CREATE_GRAPH], env=e,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), \
        (p.returncode, p.stdout[-1500:], p.stderr[-3000:])
