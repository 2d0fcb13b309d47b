"""The shared slot pool of the compiled switch (``_engine.c``) against the reference model
(docs/pool.md): random jobs on a leaf whose pool is too small for their windows, its
parent taking the overflow, with loss and duplicates on every link, in every mode. Every
datagram that crosses the leaf-parent link, every datagram a worker receives (time and
bytes), every counter of both switches and the pool's use must be identical.
"""

import numpy as np
import pytest

from ina_fabric.host.switch.model import SwitchModel
from ina_fabric.host.switch import fast
from ina_fabric.protocol.jobtable import MODES
from ina_fabric.protocol.counters import JOB_COUNTERS

from pool_net import PoolNet
from test_pool_model import random_jobs, check_results, OUTCOMES

needs_engine = pytest.mark.skipif(not fast.available(), reason=fast.WHY_NOT or "")


def run(cls, seed, narrow=False):
    rng = np.random.default_rng(1000 + seed)
    jobs = random_jobs(rng, modes=MODES)
    pool = int(rng.integers(0, sum(2 * w for _, w, *_ in jobs) + 1))
    # narrow: the jobs send int16 and int8 by turns (docs/precision.md), through the pool
    # and the parent's overflow alike
    widths = {k + 1: (16, 8)[k % 2] for k in range(len(jobs))} if narrow else None
    return PoolNet(jobs, pool, cls=cls, loss=float(rng.choice([0.0, 0.05])),
                   dup=float(rng.choice([0.0, 0.05])), seed=seed, deadline=0.002,
                   widths=widths, acks=bool(seed % 2)).run()


@needs_engine
@pytest.mark.parametrize("seed", range(30))
def test_engine_pool_matches_the_model_byte_for_byte(seed):
    model, engine = run(SwitchModel, seed), run(fast.FastSwitchModel, seed)
    assert engine.trunk == model.trunk
    assert engine.received == model.received
    for a in model.switches:
        assert dict(engine.switches[a].counters) == dict(model.switches[a].counters), a
        for job in model.switches[a].jobs:                  # and each job's own
            jc = model.switches[a].job_counters(job)
            assert jc == engine.switches[a].job_counters(job), (a, job)
            assert set(jc) <= set(JOB_COUNTERS)
    # the leaf's per-job overflow adds up to its total
    assert sum(model.leaf.job_counters(j).get("overflow", 0) for j in model.leaf.jobs) == \
        model.leaf.counters["overflow"]
    assert engine.leaf.pool_used == model.leaf.pool_used
    assert engine.pool_peak == model.pool_peak <= model.leaf.pool_slots
    assert model.done()
    check_results(engine, exact_all=False)
    c = engine.leaf.counters
    assert c["rx_data"] == sum(c[k] for k in OUTCOMES)


@needs_engine
@pytest.mark.parametrize("seed", range(8))
def test_narrow_widths_through_the_pool_match_the_model(seed):
    model, engine = run(SwitchModel, seed, True), run(fast.FastSwitchModel, seed, True)
    assert engine.trunk == model.trunk
    assert engine.received == model.received
    for a in model.switches:
        assert dict(engine.switches[a].counters) == dict(model.switches[a].counters), a
    assert model.done()
    check_results(engine, exact_all=False)


@needs_engine
def test_engine_pool_overflows_and_frees():
    jobs = [(4, 4, 3, "reliable", 40)] * 4
    net = PoolNet(jobs, 8, cls=fast.FastSwitchModel, seed=1).run()
    assert net.done()
    check_results(net, exact_all=True)
    assert net.leaf.counters["overflow"] > 0
    assert net.parent.counters["overflow_in"] == net.leaf.counters["overflow"]
    for job in list(net.leaf.jobs):
        net.leaf.remove_job(job)
    assert net.leaf.pool_used == 0


@pytest.mark.parametrize("cls", [SwitchModel, pytest.param(
    fast.FastSwitchModel, marks=needs_engine)])
def test_congested_is_marked_from_seven_eighths_of_the_pool(cls):
    """CONGESTED comes before the pool is full (model.POOL_MARK_DIV): with 16 slots,
    a RESULT sent while 14 or more are held carries it, with 13 it does not."""
    from ina_fabric.protocol import pack, unpack, Flags
    from ina_fabric.protocol.jobtable import JobConfig
    from pool_net import PARENT
    cfg = JobConfig(5, ("198.18.3.1:20000",), 16, 2, session=55)
    leaf = cls([cfg], pool_slots=16, parent=PARENT)
    flags = []
    for seq in range(15):      # one worker: each DATA completes its slot, which stays held
        out = leaf.process(pack(np.array([1, 2]), job=5, worker=0, seq=seq, session=55),
                           ("198.18.3.1", 20000), 0.0)
        flags.append(bool(unpack(out[0][1])[0]["flags"] & Flags.CONGESTED))
    assert flags == [False] * 13 + [True] * 2
    assert leaf.counters["congested"] == 2
