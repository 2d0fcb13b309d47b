"""The discrete-event simulator checks the optimizer's round times (within 10%) and
the FPGA buffer bound."""

import numpy as np
import pytest

from ina_fabric.host.schedule.model import NetConfig, RoundModel, Round, Schedule
from ina_fabric.host.schedule.search import optimize, families
from ina_fabric.host.schedule.simulate import fifo, simulate_schedule, simulate_round
from ina_fabric.host.schedule.topology import default_topology, topology_from_dict


def test_fifo_matches_a_loop():
    rng = np.random.default_rng(0)
    a = rng.uniform(0, 10, 300)
    s = rng.uniform(0, 0.2, 300)
    order = np.argsort(a, kind="stable")
    d, last = np.empty(300), -np.inf
    for k in order:
        last = max(a[k], last) + s[k]
        d[k] = last
    assert np.allclose(fifo(a, s), d)


@pytest.mark.parametrize("memory", [2e6, 1e8, 1e10])
def test_optimized_schedule_simulates_within_10_percent(memory):
    topo = default_topology()
    net = NetConfig(update_bytes=1e8, memory_bytes=memory)
    model = RoundModel(topo, net)
    best = optimize(topo, net, seed=0, sizes=[2, 3], model=model).best
    chunks = int(min(8192, max(512, 20 * net.update_bytes / memory)))
    for sim in simulate_schedule(model, best.schedule, chunks=chunks, seed=1):
        assert sim.error <= 0.10, (sim.time, sim.predicted)
        assert sim.overflows == 0
        assert max(sim.peak_buffer.values()) <= memory + net.update_bytes / chunks


def test_slowed_all_to_all_buffer_fills_but_fits():
    topo = default_topology()
    net = NetConfig(update_bytes=2e8, memory_bytes=2e7)
    model = RoundModel(topo, net)
    a2a = Round.cliques([range(9)], 9)
    sim = simulate_round(model, a2a, chunks=4000, seed=2)
    assert model.plan(a2a)[0].memory_bound
    assert sim.error <= 0.10 and sim.overflows == 0
    assert max(sim.peak_buffer.values()) > 0.5 * net.memory_bytes   # the memory is used


@pytest.mark.parametrize("fpga,multicast", [(False, True), (False, False), (True, False)])
def test_baseline_modes_agree(fpga, multicast):
    topo = default_topology()
    net = NetConfig(update_bytes=1e8, memory_bytes=1e10, fpga=fpga, multicast=multicast)
    model = RoundModel(topo, net)
    for sched in [Schedule([Round.cliques([range(9)], 9)])] + list(families(topo).values()):
        for sim in simulate_schedule(model, sched, chunks=512):
            assert sim.error <= 0.10, (sched.family, sim.time, sim.predicted)


def test_shared_backbone_link_is_simulated():
    # a chain Tokyo - Los Angeles - New York: both Tokyo's and LA's streams to NY share
    # the LA-NY hop, whose capacity is the bottleneck
    doc = {"bandwidth_gbps": 100, "island": [{"name": n} for n in ("Tokyo", "Los Angeles", "New York")],
           "link": [{"a": "Tokyo", "b": "Los Angeles", "capacity_gbps": 100},
                    {"a": "Los Angeles", "b": "New York", "capacity_gbps": 50}]}
    topo = topology_from_dict(doc, "chain")
    net = NetConfig(update_bytes=1e8, memory_bytes=1e10)
    model = RoundModel(topo, net)
    rnd = Round.cliques([(0, 1, 2)], 3)
    (p,) = model.plan(rnd)
    assert p.rate == pytest.approx(50e9 / 8 / 2)   # two trees share the 50 Gb/s hop
    sim = simulate_round(model, rnd, chunks=1024)
    assert sim.error <= 0.10
