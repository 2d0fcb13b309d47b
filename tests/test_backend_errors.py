"""The ``ina`` backend's one-line errors and dtype rules, in one process (world size 1
on a HashStore; world size 33 is refused before anything is created)."""

import warnings

import numpy as np
import pytest
import torch
import torch.distributed as dist

from ina_fabric.distributed import InaOptions, JobNotInstalled, WorldTooLarge
from ina_fabric.host.transport import SwitchUnavailable

pytestmark = pytest.mark.xdist_group("torch")


@pytest.fixture(scope="module")
def switch(ina_switch):
    return ina_switch


@pytest.fixture
def env(monkeypatch, switch):
    for k in ("INA_FALLBACK", "INA_DTYPES", "INA_STATIC_JOB", "INA_PORT", "INA_JOB",
              "INA_SESSION", "INA_MODE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("INA_SWITCH", f"{switch[0]}:{switch[1]}")
    monkeypatch.setenv("INA_ELEMENTS", "1024")
    yield monkeypatch
    if dist.is_initialized():
        dist.destroy_process_group()


def init(world=1, **options):
    dist.init_process_group("ina", store=dist.HashStore(), rank=0, world_size=world,
                            pg_options=InaOptions(**options) if options else None)
    return dist.distributed_c10d._get_default_group()


def test_world_size_above_the_member_limit(env):
    with pytest.raises(WorldTooLarge, match=r"^INA: world size 33 is above the switch's "
                                            r"limit of 32 members per job"):
        init(world=33)


def test_switch_unreachable_raises_by_default(env, ports):
    dead, = ports(1)
    env.setenv("INA_SWITCH", f"127.0.0.1:{dead}")
    with pytest.raises(SwitchUnavailable, match=rf"^INA: no switch answered at "
                                                rf"127.0.0.1:{dead}; not falling back to Gloo "
                                                rf"\(INA_FALLBACK=gloo allows it\)$"):
        init(connect_timeout=0.3)


def test_switch_unreachable_falls_back_to_gloo_when_asked(env, ports):
    dead, = ports(1)
    env.setenv("INA_SWITCH", f"127.0.0.1:{dead}")
    env.setenv("INA_FALLBACK", "gloo")
    with pytest.warns(RuntimeWarning, match="no switch answered.*falling back to Gloo"):
        pg = init(connect_timeout=0.3)
    t = torch.arange(5.0)
    dist.all_reduce(t)
    assert not pg.use_switch and t.tolist() == [0, 1, 2, 3, 4]


def test_static_job_not_installed(env, ports):
    port, = ports(1)
    env.setenv("INA_PORT", str(port))
    env.setenv("INA_SESSION", "0x77")
    # named at init (issue 43: rank 0 asks the switch where a static job resumes)
    with pytest.raises(JobNotInstalled, match=r"^INA: the switch at \S+ has no job 77 .*"
                                              r"not falling back to Gloo"):
        init(static_job=True, connect_timeout=0.5, job=77)


def test_dtypes_convert_or_delegate(env):
    pg = init(job=78)
    calls = lambda: pg.state.stats.calls  # noqa: E731
    x = torch.linspace(-3, 3, 3000)
    y = x.clone()
    dist.all_reduce(y)
    assert calls() == 1 and torch.allclose(y, x, atol=1e-6)
    for dt in (torch.float16, torch.bfloat16):     # converted to float32 for the wire
        t = x.to(dt)
        dist.all_reduce(t)
        assert t.dtype == dt and torch.equal(t, x.to(dt))
    assert calls() == 3
    i = torch.arange(10)                           # integers: Gloo, exact
    dist.all_reduce(i)
    assert i.tolist() == list(range(10)) and calls() == 3
    with pytest.warns(RuntimeWarning, match="float64 all_reduce runs on Gloo"):
        d = x.double()
        dist.all_reduce(d)
    assert calls() == 3 and torch.equal(d, x.double())
    a = x.clone()
    dist.all_reduce(a, op=dist.ReduceOp.AVG)       # world 1: AVG = SUM / 1
    assert calls() == 4 and torch.allclose(a, x, atol=1e-6)
    ia = torch.arange(4)
    dist.all_reduce(ia, op=dist.ReduceOp.AVG)      # AVG on Gloo (which lacks it)
    assert ia.tolist() == [0, 1, 2, 3]


def test_dtypes_strict_refuses(env):
    pg = init(job=95, dtypes="strict")   # (78 + 1 is a subgroup's job above: taken)
    with pytest.raises(TypeError, match=r"^INA: all_reduce of torch.int64 on cpu refused "
                                        r"\(INA_DTYPES=strict\)"):
        dist.all_reduce(torch.arange(3))
    with pytest.raises(TypeError, match=r"^INA: all_reduce of torch.bfloat16 refused"):
        dist.all_reduce(torch.ones(3, dtype=torch.bfloat16))
    t = torch.ones(3)
    dist.all_reduce(t)
    assert pg.state.stats.calls == 1


def test_cpu_tensors_are_reduced_zero_copy_in_place(env):
    pg = init(job=80, stage_bytes=4096)     # 1024-element chunks: 3 calls for 2500
    seen = []

    class Spy(type(pg.state)):      # the state has __slots__: spy in a subclass
        __slots__ = ()

        def reduce_array(self, arr, in_place=False):
            seen.append((arr, in_place))
            return super().reduce_array(arr, in_place)

    pg.state.__class__ = Spy
    t = torch.randn(2500)
    base = t.clone()
    ptr = t.data_ptr()
    dist.all_reduce(t)
    # calls on the tensor's own memory, summed in place (no output array, no copy back)
    assert [(a.size, ip) for a, ip in seen] == [(1024, True), (1024, True), (452, True)]
    assert all(np.shares_memory(a, t.numpy()) for a, _ in seen)
    assert t.data_ptr() == ptr and torch.allclose(t, base, atol=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        w = dist.all_reduce(t, async_op=True)
        assert w.wait() and w.is_completed()


def test_the_installer_removes_its_job_at_shutdown(env, switch):
    """Rank 0 removes the job it installed when the group is destroyed (every rank
    done), so the next run may take the same id at once. Before, the id stayed held by
    the ended run's session and the next run was refused ("taken by another run") for
    the switch's idle reclaim time (60 s)."""
    from ina_fabric.protocol.control_client import query_status
    for run in range(2):                # the same job id, two runs, two sessions
        pg = init(job=97)
        t = torch.ones(100)
        dist.all_reduce(t)
        assert pg.state.stats.calls == 1 and torch.equal(t, torch.ones(100))
        assert "97" in query_status(switch)["jobs"]
        dist.destroy_process_group()
        assert "97" not in query_status(switch)["jobs"], run


def test_shutdown_stops_the_size_agreement_group(env):
    """The size check's own Gloo group is not registered with the ProcessGroup, so
    nothing but ``shutdown`` stops it: two ranks (threads, one store) agree on a size,
    then shut down; the group is gone on both. (A rank's process sometimes aborted
    at interpreter exit with "terminate called without an active exception" when the
    group was left to the destructors.)"""
    import datetime
    from ina_fabric.host.ddp.backend import ProcessGroupIna
    from conftest import run_threads
    store, out = dist.HashStore(), {}

    def rank(r):
        pg = ProcessGroupIna(store, r, 2, datetime.timedelta(seconds=20),
                             InaOptions(job=96))
        assert pg._sizes is not None
        pg._agree_sizes([torch.ones(10)])
        pg.shutdown()
        out[r] = pg._sizes
    errs = run_threads(rank, range(2))
    assert not errs, errs
    assert out == {0: None, 1: None}
