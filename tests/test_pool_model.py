"""The shared slot pool, as the reference model defines it (docs/pool.md).

Random jobs share a leaf switch whose pool is too small for their windows; its parent
takes the overflow. Every worker must get every RESULT, exact (the sum of the workers its
bitmap names, saturated to int32 with OVERFLOW as without a pool), every datagram either
switch received must be accounted for by exactly one counter, the pool must never hold
more slots than it has, and what the leaf sent on (``overflow``) must be what the parent
took (``overflow_in``), less what the link lost.
"""

import numpy as np
import pytest

from ina_fabric.host.switch.model import SwitchModel
from ina_fabric.protocol import unpack, MsgType, Flags
from ina_fabric.protocol.jobtable import JobConfig, ConfigError

from pool_net import PoolNet, LEAF, PARENT, worker_addr

#: the outcomes of a DATA that passed the job's checks (rx_data), one each
OUTCOMES = ("accepted", "duplicates", "late", "drop_stale", "drop_out_of_window",
            "overflow")


def random_jobs(rng, modes=("reliable",)):
    return [(int(rng.integers(1, 5)), int(2 ** rng.integers(0, 4)), int(rng.integers(1, 6)),
             str(rng.choice(modes)), int(rng.integers(1, 30)))
            for _ in range(int(rng.integers(1, 5)))]


def check_results(net, exact_all):
    for addr, (cfg, w) in net.workers.items():
        assert sorted(net.got[addr]) == list(range(net.packets[cfg.job])), addr
        for seq, data in net.got[addr].items():
            if data is None:            # abandoned (bounded mode: the slot moved on)
                assert not exact_all
                continue
            h, body = unpack(data)
            bitmap = int(h["bitmap"])
            if exact_all:
                assert bitmap == (1 << cfg.n) - 1 and int(h["count"]) == cfg.n
                assert not h["flags"] & Flags.PARTIAL
            assert int(h["count"]) == bin(bitmap).count("1")
            want, sat = net.expected(cfg.job, seq, bitmap)
            assert np.array_equal(body, want), (addr, seq)
            assert bool(h["flags"] & Flags.OVERFLOW) == sat
            # every worker of the job got the same bytes (but for worker and RETRANSMIT)
            first = next(d for d in (net.got[m.addr][seq] for m in cfg.members) if d)
            assert data[8:] == first[8:] and data[:2] == first[:2]


def check_accounting(net):
    for addr, sw in net.switches.items():
        c = sw.counters
        assert c["rx_data"] == sum(c[k] for k in OUTCOMES), (addr, dict(c))
        delivered = net.delivered[addr]
        assert c["rx"] == sum(delivered.values())
        assert c["rx_data"] == delivered.get(MsgType.DATA, 0)
        assert delivered.get(MsgType.RESULT, 0) == c["relayed"] + c["drop_result"]
    up = sum(1 for _, src, dest, _ in net.trunk if src == LEAF)
    assert net.leaf.counters["overflow"] == up
    took = net.parent.counters["overflow_in"]
    assert took == net.delivered[PARENT].get(MsgType.DATA, 0)
    if not (net.loss or net.dup):
        assert took == up
    elif not net.dup:
        assert took <= up
    assert net.parent.counters["overflow"] == 0 and net.parent.pool_slots is None
    assert net.pool_peak <= net.leaf.pool_slots
    held = sum(s.held for js in net.leaf.jobs.values() for half in js.slots for s in half)
    assert held == net.leaf.pool_used


@pytest.mark.parametrize("seed", range(30))
def test_random_jobs_on_a_small_pool_get_exact_results(seed):
    rng = np.random.default_rng(seed)
    jobs = random_jobs(rng)
    need = sum(2 * window for _, window, *_ in jobs)
    pool = int(rng.integers(0, need + 1))
    loss = float(rng.choice([0.0, 0.0, 0.05]))
    net = PoolNet(jobs, pool, loss=loss, dup=float(rng.choice([0.0, 0.05])),
                  seed=seed).run()
    assert net.done(), (jobs, pool)
    check_results(net, exact_all=True)
    check_accounting(net)


@pytest.mark.parametrize("seed", range(10))
def test_bounded_jobs_on_a_small_pool_get_exact_partial_results(seed):
    rng = np.random.default_rng(100 + seed)
    jobs = random_jobs(rng, modes=("bounded", "bounded-skip", "reliable"))
    pool = int(rng.integers(0, sum(2 * w for _, w, *_ in jobs) + 1))
    net = PoolNet(jobs, pool, loss=0.05, seed=seed, deadline=0.002).run()
    assert net.done()
    check_results(net, exact_all=False)
    check_accounting(net)


def test_a_full_pool_sends_to_the_parent_and_a_big_one_does_not():
    jobs = [(4, 4, 3, "reliable", 40)] * 4
    small = PoolNet(jobs, 8, seed=1).run()
    assert small.done()
    check_results(small, exact_all=True)
    check_accounting(small)
    assert small.leaf.counters["overflow"] > 0
    assert small.parent.counters["results"] > 0
    assert small.pool_peak == 8
    big = PoolNet(jobs, 4 * 8, seed=1).run()
    assert big.done() and big.leaf.counters["overflow"] == 0
    check_results(big, exact_all=True)
    # the same sums either way
    for a in small.workers:
        assert {s: unpack(d)[1].tolist() for s, d in small.got[a].items()} == \
            {s: unpack(d)[1].tolist() for s, d in big.got[a].items()}
    # every slot goes back to the pool once its RESULT is confirmed or the job leaves
    for job in list(small.leaf.jobs):
        small.leaf.remove_job(job)
    assert small.leaf.pool_used == 0


def test_a_pool_needs_a_parent():
    with pytest.raises(ValueError, match="parent"):
        SwitchModel(pool_slots=8)


def test_with_a_pool_no_job_is_refused_for_memory():
    members = tuple(f"198.18.3.{i + 1}:20000" for i in range(2))
    big = [JobConfig(j, members, 1024, 1024) for j in range(1, 5)]
    capped = SwitchModel(max_total_bytes=2 * 1024 * 1024 * 12 * 2)
    capped.add_job(big[0])
    capped.add_job(big[1])
    with pytest.raises(ConfigError, match="free"):
        capped.add_job(big[2])
    pooled = SwitchModel(max_total_bytes=2 * 1024 * 1024 * 12 * 2, pool_slots=4096,
                         parent=PARENT)
    for cfg in big:
        pooled.add_job(cfg)
    assert sorted(pooled.jobs) == [1, 2, 3, 4]
    assert pooled.status()["pool"] == {"slots": 4096, "used": 0}
    with pytest.raises(ValueError):
        SwitchModel(pool_slots=-1)


def test_forwarded_data_is_taken_only_with_the_session_and_a_member_id():
    cfg = JobConfig(7, ("198.18.3.1:20000", "198.18.3.2:20000"), 2, 2, session=77)
    parent = SwitchModel([cfg])
    from ina_fabric.protocol import pack
    d = pack(np.array([1, 2]), job=7, worker=1, seq=0, session=77, flags=Flags.FORWARDED)
    assert parent.process(d, LEAF, 0.0) == []
    assert parent.counters["overflow_in"] == 1 and parent.counters["accepted"] == 1
    bad = pack(np.array([1, 2]), job=7, worker=1, seq=0, session=78, flags=Flags.FORWARDED)
    parent.process(bad, LEAF, 0.0)
    assert parent.counters["drop_bad_session"] == 1
    nomember = pack(np.array([1, 2]), job=7, worker=2, seq=0, session=77,
                    flags=Flags.FORWARDED)
    parent.process(nomember, LEAF, 0.0)
    assert parent.counters["drop_unknown_source"] == 1
    # the last member's DATA closes the slot: the RESULT goes to the forwarding switch
    d0 = pack(np.array([3, 4]), job=7, worker=0, seq=0, session=77, flags=Flags.FORWARDED)
    out = parent.process(d0, LEAF, 0.0)
    assert [dest for dest, _ in out] == [LEAF]
    h, body = unpack(out[0][1])
    assert int(h["type"]) == MsgType.RESULT and body.tolist() == [4, 6]


def test_a_result_sent_while_the_pool_is_full_carries_congested():
    from ina_fabric.protocol import pack
    cfg = JobConfig(5, ("198.18.3.1:20000",), 2, 2, session=55)
    for slots, flagged in ((1, True), (2, False)):
        leaf = SwitchModel([cfg], pool_slots=slots, parent=PARENT)
        out = leaf.process(pack(np.array([1, 2]), job=5, worker=0, seq=0, session=55),
                           ("198.18.3.1", 20000), 0.0)
        h, body = unpack(out[0][1])
        assert bool(h["flags"] & Flags.CONGESTED) == flagged and body.tolist() == [1, 2]
        assert leaf.counters["congested"] == int(flagged)
        assert leaf.job_counters(5).get("congested", 0) == int(flagged)
    # without a pool, never
    plain = SwitchModel([cfg])
    out = plain.process(pack(np.array([1, 2]), job=5, worker=0, seq=0, session=55),
                        ("198.18.3.1", 20000), 0.0)
    assert not unpack(out[0][1])[0]["flags"] & Flags.CONGESTED


def test_a_workers_ack_frees_the_stored_results_below_it():
    # two workers, window 4: without an ack, the result of seq 0 is held until seq 4 is
    # complete; with acks (count = seq - lowest seq without a RESULT + 1), as soon as
    # both workers' DATA of seq 1 say they have it
    from ina_fabric.protocol import pack
    cfg = JobConfig(5, ("198.18.3.1:20000", "198.18.3.2:20000"), 4, 2, session=55)
    src = [("198.18.3.1", 20000), ("198.18.3.2", 20000)]
    for acks, used in ((False, [1, 1, 2, 2]), (True, [1, 1, 2, 1])):
        leaf = SwitchModel([cfg], pool_slots=8, parent=PARENT)
        seen = []
        for seq in (0, 1):
            for w in (0, 1):
                # seq 1's DATA: "I have the RESULT of seq 0" (count 1) from both workers
                d = pack(np.array([1, 2]), job=5, worker=w, seq=seq, session=55,
                         count=1 if acks and seq else 0)
                leaf.process(d, src[w], 0.0)
                seen.append(leaf.pool_used)
        assert seen == used, acks
        # an ack frees a slot only once every member's ack is past it, and a re-send
        # of a freed seq is stale (no worker that acked it re-sends it)
        if acks:
            out = leaf.process(pack(np.array([1, 2]), job=5, worker=0, seq=0, session=55),
                               src[0], 0.0)
            assert leaf.counters["drop_stale"] == 1
            assert out[0][1][1] == MsgType.ERROR


@pytest.mark.parametrize("seed", range(10))
def test_with_acks_results_stay_exact_and_less_overflows(seed):
    rng = np.random.default_rng(200 + seed)
    jobs = [(int(rng.integers(2, 5)), 8, 3, "reliable", 60)] * int(rng.integers(2, 5))
    pool = int(rng.integers(8, 2 * 8 * len(jobs)))
    loss = float(rng.choice([0.0, 0.05]))
    nets = [PoolNet(jobs, pool, loss=loss, seed=seed, acks=a).run() for a in (False, True)]
    for net in nets:
        assert net.done()
        check_results(net, exact_all=True)
        check_accounting(net)
    assert nets[1].leaf.counters["overflow"] <= nets[0].leaf.counters["overflow"]
