"""The optimizer reproduces the memory-driven shift on the 9-city topology."""

from dataclasses import replace

import pytest

from ina_fabric.host.schedule.model import NetConfig, RoundModel, Round, Schedule
from ina_fabric.host.schedule.search import optimize
from ina_fabric.host.schedule.topology import default_topology, synthetic_topology

pytestmark = pytest.mark.xdist_group("schedule_opt")


@pytest.fixture(scope="module")
def topo():
    return default_topology()


def test_small_memory_small_rotating_cliques(topo):
    # M = 2 MB: enough to absorb the jitter of an aligned 3-clique at line rate,
    # far from covering the long-haul skew of all-to-all
    res = optimize(topo, NetConfig(memory_bytes=2e6), seed=0)
    b = res.best
    assert res.exact
    assert (b.family, b.k) == ("cliques", 3)
    assert len(b.schedule.rounds) == 2 and b.sigma2 < 1e-9
    a2a = next(c for c in res.candidates if c.family == "all-to-all")
    assert a2a.objective < b.objective / 10


def test_large_memory_all_to_all_wins(topo):
    net = NetConfig(memory_bytes=10e9)
    b = optimize(topo, net, seed=0).best
    assert b.family == "all-to-all"
    # M covers the longest skew at line rate: all-to-all is not slowed at all
    model = RoundModel(topo, net)
    (p,) = model.plan(Round.cliques([range(9)], 9))
    assert not p.memory_bound and p.rate == pytest.approx(topo.bandwidth.min())
    assert max(p.buffer.values()) < net.memory_bytes


def test_memory_slows_rather_than_forbids(topo):
    # with little memory all-to-all is paced at (M - window) / (skew + jitter): finite, slow
    a2a = Round.cliques([range(9)], 9)
    slow = RoundModel(topo, NetConfig(memory_bytes=1e6)).plan(a2a)[0]
    fast = RoundModel(topo, NetConfig(memory_bytes=1e10)).plan(a2a)[0]
    assert slow.memory_bound and 0 < slow.rate < fast.rate
    net = NetConfig(memory_bytes=1e6)
    worst = max(slow.skew.values()) + net.jitter_s
    assert slow.rate == pytest.approx((net.memory_bytes - net.slot_window_bytes) / worst, rel=1e-6)


def test_no_fpga_all_to_all_is_ingress_bound(topo):
    net = NetConfig(fpga=False)
    t = RoundModel(topo, net).round_time(Round.cliques([range(9)], 9))
    assert t >= 8 * net.update_bytes / topo.bandwidth.min()


def test_seeded_heuristic_is_reproducible():
    topo = synthetic_topology(14, seed=3)
    net = NetConfig(memory_bytes=5e6)
    a = optimize(topo, net, seed=7, exact_max_n=0, sizes=[2, 3, 4], iters=60)
    b = optimize(topo, net, seed=7, exact_max_n=0, sizes=[2, 3, 4], iters=60)
    assert not a.exact
    assert [c.row() for c in a.candidates] == [c.row() for c in b.candidates]
    assert a.best.objective > 0
