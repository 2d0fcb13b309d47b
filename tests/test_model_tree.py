"""Trees of switches in the reference model (docs/fabric.md): a leaf sums its workers and
sends one DATA to its parent, the root's RESULT reaches every worker through the leaves,
recovery happens at the lowest level that holds the result, bounded deadlines are per
level, and every worker gets the same payload."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck

from ina_fabric.host.switch import SwitchModel
from ina_fabric.protocol import pack, unpack, MsgType, Flags, HEADER_BYTES
from ina_fabric.protocol.fields import MAX_JOB_WORKERS, GROUP_WORKER
from ina_fabric.protocol.jobtable import (JobConfig, ConfigError, parse_control, Member,
                                          ENTRY_TREE)

from tree_net import TreeNet, SPINE, leaf_addr, worker_addr, tree_configs, JOB, SESSION

E = 4


def values(worker_index, seq):
    """A worker's int32 contribution to ``seq`` (distinct per worker and seq)."""
    return np.arange(E, dtype=np.int64) * (worker_index + 1) + 1000 * seq - 7 * worker_index


def exponent(k, s):
    return (k + s) % 5 - 2


def send_one(net, k, s, **kw):
    """Worker number ``k`` sends its DATA for ``seq`` ``s``."""
    net.send(net.workers[k], s, values(k, s), exponent=exponent(k, s), **kw)


def send_all(net, seqs, skip=(), **kw):
    for k, a in enumerate(net.workers):
        if a in skip:
            continue
        for s in seqs:
            net.send(a, s, values(k, s), exponent=exponent(k, s), **kw)


def recover(net, seqs, rounds=60, step=0.005):
    """Reliable mode: every worker re-sends the DATA of each seq it has no RESULT of."""
    for _ in range(rounds):
        missing = [(k, a, s) for k, a in enumerate(net.workers) for s in seqs
                   if s not in net.results(a)]
        if not missing:
            return
        for k, a, s in missing:
            net.send(a, s, values(k, s), exponent=exponent(k, s), retransmit=True)
        net.run(net.now + step)
    raise AssertionError(f"{len(missing)} results never arrived")


def check_same_everywhere(net, seqs, contributors=None):
    """Every worker has one RESULT per seq; payload, count, exponent and flags (but
    RETRANSMIT) are the same for all; the payload is the exact sum of the contributors."""
    contributors = list(range(net.n)) if contributors is None else contributors
    for s in seqs:
        got = [net.results(a)[s] for a in net.workers]
        _, h0, b0 = got[0]
        for _, h, b in got:
            assert b.tobytes() == b0.tobytes()
            assert (int(h["count"]), int(h["exponent"]), int(h["flags"]) & ~Flags.RETRANSMIT,
                    int(h["nelem"])) == (int(h0["count"]), int(h0["exponent"]),
                                         int(h0["flags"]) & ~Flags.RETRANSMIT,
                                         int(h0["nelem"]))
        expect = sum(values(k, s) for k in contributors)
        np.testing.assert_array_equal(b0, expect)
        assert int(h0["count"]) == len(contributors)
        assert bool(int(h0["flags"]) & Flags.PARTIAL) == (len(contributors) < net.n)
        assert int(h0["exponent"]) == max(exponent(k, s) for k in contributors)


# -- the job table ---------------------------------------------------------------------
def test_tree_entries_round_trip_through_control():
    spine, leaves = tree_configs([32] * 32)
    assert spine.total == MAX_JOB_WORKERS and spine.children
    for cfg in [spine] + leaves:
        op, back = parse_control(cfg.to_bytes())
        assert op == "install" and back == cfg
    assert leaves[3].parent == SPINE and leaves[3].index == 3 and leaves[3].total == 32


def test_a_job_past_1024_workers_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"33 members, need 1..32") as e:
        tree_configs([32] * 33)                     # a 33rd leaf
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"1025 workers; a job holds at most 1024") as e:
        tree_configs([32] * 31 + [33])              # a 33rd worker in a leaf
    with pytest.raises(ConfigError, match="1025 workers; a job holds at most 1024") as e:
        JobConfig(1, tuple(f"198.18.1.{i}:1" for i in range(1, 33)), children=True,
                  workers=1025)                     # (a deeper tree's spine)
    assert "\n" not in str(e.value)


def test_one_switch_entries_are_unchanged():
    """A job without a tree has no tree record: the gateware's entries stay as they were."""
    cfg = JobConfig(1, ("127.0.0.1:5000",), session=SESSION)
    raw = cfg.to_bytes()
    assert not int.from_bytes(raw[16:18], "big") & ENTRY_TREE
    assert parse_control(raw) == ("install", cfg)


def test_bad_tree_entries():
    with pytest.raises(ConfigError, match="index"):
        JobConfig(1, ("127.0.0.1:5000",), parent=("127.0.0.1", 19900), index=32)
    with pytest.raises(ConfigError, match="one worker each"):
        JobConfig(1, ("127.0.0.1:5000",), workers=4)
    with pytest.raises(ConfigError, match="at least 2"):
        JobConfig(1, ("127.0.0.1:5000", "127.0.0.1:5001"), children=True, workers=1)


# -- reliable mode ---------------------------------------------------------------------
def test_two_level_sum_reaches_every_worker_with_its_leafs_bitmap():
    net = TreeNet([3, 2, 4])
    send_all(net, range(3))
    net.run()
    check_same_everywhere(net, range(3))
    for a in net.workers:
        i, w = net.leaf_of[a]
        for s, (_, h, _) in net.results(a).items():
            assert int(h["bitmap"]) == (1 << net.shape[i]) - 1   # its leaf's members
            assert int(h["worker"]) == GROUP_WORKER
    # one DATA up per leaf and seq, one RESULT down per leaf and seq
    ups = [x for x in net.trunk if x[2] == SPINE]
    downs = [x for x in net.trunk if x[1] == SPINE]
    assert len(ups) == len(downs) == 3 * 3
    for _, src, _, d in ups:
        h = unpack(d)[0]
        i = int(h["worker"])
        assert src == leaf_addr(i) and int(h["type"]) == MsgType.DATA
        assert int(h["count"]) == net.shape[i] and int(h["bitmap"]) == (1 << net.shape[i]) - 1
    assert net.counters(SPINE)["results"] == 3
    assert all(net.counters(leaf_addr(i))["relayed"] == 3 for i in range(3))


def test_the_root_needs_every_child_and_not_one_datagram_per_worker():
    net = TreeNet([2, 2])
    for k, a in enumerate(net.workers[:3]):       # leaf 1 lacks a worker
        send_one(net, k, 0)
    net.run()
    assert all(net.results(a) == {} for a in net.workers)
    assert net.counters(leaf_addr(0))["up"] == 1 and net.counters(leaf_addr(1))["up"] == 0
    send_one(net, 3, 0)
    net.run()
    check_same_everywhere(net, [0])


def test_a_lost_result_is_answered_by_the_leaf():
    """A worker whose RESULT was lost re-sends; its leaf holds the result and answers it
    (unicast), and nothing goes to the spine."""
    net = TreeNet([2, 2])
    send_all(net, [0])
    net.run()
    lost = net.workers[3]
    net.received[lost].clear()
    trunk = len(net.trunk)
    send_one(net, 3, 0, retransmit=True)
    net.run()
    t, h, b = net.results(lost)[0]
    assert int(h["flags"]) & Flags.RETRANSMIT and int(h["worker"]) == 1
    assert len(net.trunk) == trunk                  # the spine never heard of it
    check_same_everywhere(net, [0])


def test_a_lost_upward_data_is_sent_again_on_a_workers_resend():
    net = TreeNet([2, 2])
    spine = net.switches[SPINE]
    real = spine.process
    dropped = []

    def lossy(data, src, now):
        if src == leaf_addr(1) and not dropped:
            dropped.append(data)
            return spine.tick(now)
        return real(data, src, now)
    spine.process = lossy
    send_all(net, [0])
    net.run()
    assert dropped and all(net.results(a) == {} for a in net.workers)
    send_one(net, 2, 0, retransmit=True)     # a worker of leaf 1
    net.run()
    assert net.counters(leaf_addr(1))["up_resent"] == 1
    check_same_everywhere(net, [0])


def test_a_lost_result_of_the_spine_is_recovered_through_the_leaf():
    net = TreeNet([2, 2])
    leaf = net.switches[leaf_addr(0)]
    real = leaf.process
    dropped = []

    def lossy(data, src, now):
        if src == SPINE and not dropped:
            dropped.append(data)
            return leaf.tick(now)
        return real(data, src, now)
    leaf.process = lossy
    send_all(net, [0])
    net.run()
    assert [net.results(a) != {} for a in net.workers] == [False, False, True, True]
    send_one(net, 0, 0, retransmit=True)
    net.run()
    assert net.counters(SPINE)["resent"] == 1
    check_same_everywhere(net, [0])


def test_results_only_from_the_parent_and_only_when_awaited():
    net = TreeNet([1, 1])
    send_all(net, [0])
    net.run()
    leaf = net.switches[leaf_addr(0)]
    res = net.received[net.workers[0]][0][1]
    c0 = dict(leaf.counters)
    assert leaf.process(res, SPINE, net.now) == []                    # nothing awaits it
    assert leaf.process(res, ("198.18.9.9", 19900), net.now) == []    # not the parent
    assert SwitchModel([net.cfg]).process(res, leaf_addr(0), 0.0) == []   # the root: none
    c = leaf.counters
    assert c["drop_result"] == c0["drop_result"] + 1
    assert c["drop_unknown_source"] == c0["drop_unknown_source"] + 1


def test_a_child_switch_covering_more_than_the_job_is_malformed():
    spine, _ = tree_configs([2, 2])
    m = SwitchModel([spine])
    d = pack(np.ones(E), job=JOB, worker=0, seq=0, count=5, session=SESSION)
    assert m.process(d, leaf_addr(0), 0.0) == []
    assert m.counters["drop_malformed"] == 1 and m.counters["accepted"] == 0


def test_overflow_at_a_leaf_reaches_every_worker():
    net = TreeNet([2, 1])
    big = np.full(E, 2**31 - 1)
    net.send(net.workers[0], 0, big)
    net.send(net.workers[1], 0, big)
    net.send(net.workers[2], 0, -big)
    net.run()
    flags = {int(net.results(a)[0][1]["flags"]) for a in net.workers}
    assert flags == {Flags.OVERFLOW}
    np.testing.assert_array_equal(net.results(net.workers[0])[0][2], np.zeros(E))


# -- bounded mode ----------------------------------------------------------------------
def test_a_straggler_costs_one_leaf_deadline_not_a_cascade():
    net = TreeNet([3, 3], mode="bounded", leaf_deadline=0.010, spine_deadline=0.030)
    straggler = net.workers[4]
    send_all(net, [0], skip=[straggler])
    net.run()
    check_same_everywhere(net, [0], contributors=[0, 1, 2, 3, 5])
    times = [net.results(a)[0][0] for a in net.workers if a != straggler]
    assert max(times) < 0.010 + 0.001             # one leaf deadline and a few hops
    assert min(times) > 0.010                     # everyone waited for that deadline
    for a in net.workers:
        i, _ = net.leaf_of[a]
        bm = int(net.results(a)[0][1]["bitmap"]) if a != straggler else None
        if a != straggler:
            assert bm == (0b111 if i == 0 else 0b101)
    # the straggler comes late: its leaf answers it with the same result
    send_one(net, 4, 0)
    net.run()
    check_same_everywhere(net, [0], contributors=[0, 1, 2, 3, 5])
    assert net.counters(SPINE)["partials"] == 1 and net.counters(leaf_addr(1))["partials"] == 1


def test_a_silent_rack_costs_one_spine_deadline_and_its_workers_see_they_are_out():
    net = TreeNet([2, 2], mode="bounded", leaf_deadline=0.010, spine_deadline=0.030)
    send_all(net, [0], skip=net.workers[2:])
    net.run()
    first = [net.results(a)[0][0] for a in net.workers[:2]]
    assert 0.030 < min(first) and max(first) < 0.031
    # rack 1 wakes up: its partial sum is late at the spine, which answers with the
    # stored result; rack 1's workers get the same bytes with bitmap 0 (not in the sum)
    for k in (2, 3):
        send_one(net, k, 0)
    net.run()
    check_same_everywhere(net, [0], contributors=[0, 1])
    assert {int(net.results(a)[0][1]["bitmap"]) for a in net.workers[2:]} == {0}


# -- properties ------------------------------------------------------------------------
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4),
       nseq=st.integers(1, 6), loss=st.sampled_from([0.0, 0.1, 0.3]),
       dup=st.sampled_from([0.0, 0.2]), seed=st.integers(0, 2**16))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_reliable_tree_under_loss_gives_every_worker_the_exact_sum(shape, nseq, loss, dup,
                                                                    seed):
    net = TreeNet(shape, loss=loss, dup=dup, seed=seed)
    seqs = range(nseq)
    send_all(net, seqs)
    net.run(0.005)
    recover(net, seqs)
    check_same_everywhere(net, seqs)


@given(shape=st.lists(st.integers(1, 4), min_size=2, max_size=4),
       absent=st.sets(st.integers(0, 15), max_size=5), seed=st.integers(0, 2**16),
       loss=st.sampled_from([0.0, 0.1]))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_bounded_tree_gives_every_worker_the_same_bytes(shape, absent, seed, loss):
    """Bounded: whatever is lost or missing, the workers that get a RESULT of a seq all
    get the same payload, count and exponent, the count is the number of workers whose
    DATA the payload sums, and each worker's bitmap bit says whether it is one of them."""
    net = TreeNet(shape, mode="bounded", loss=loss, seed=seed)
    skip = [a for k, a in enumerate(net.workers) if k in absent]
    send_all(net, range(3), skip=skip)
    net.run()
    # a second chance for everyone (a re-send, answered from the stored result)
    for k, a in enumerate(net.workers):
        for s in range(3):
            if s not in net.results(a):
                send_one(net, k, s, retransmit=True, lossy=False)
    net.run()
    for s in range(3):
        got = {a: net.results(a)[s] for a in net.workers if s in net.results(a)}
        if not got:
            continue
        payloads = {b.tobytes() for _, _, b in got.values()}
        assert len(payloads) == 1
        counts = {int(h["count"]) for _, h, _ in got.values()}
        assert len(counts) == 1
        # who is in, from the trunk: the spine's RESULT names the leaves in the sum, each
        # leaf's DATA up (every copy the same bytes but RETRANSMIT) its workers in it
        root = [unpack(d)[0] for _, src, _, d in net.trunk
                if src == SPINE and int(unpack(d)[0]["seq"]) == s]
        assert len({int(h["bitmap"]) for h in root}) == 1
        leaves_in = int(root[0]["bitmap"])
        ins = []
        for i in range(len(shape)):
            ups = {int(unpack(d)[0]["bitmap"]) for _, src, dst, d in net.trunk
                   if src == leaf_addr(i) and int(unpack(d)[0]["seq"]) == s}
            assert len(ups) <= 1
            if leaves_in >> i & 1:
                up = ups.pop()              # the spine summed it: it came, once at least
                ins += [k for k, a in enumerate(net.workers)
                        if net.leaf_of[a][0] == i and up >> net.leaf_of[a][1] & 1]
        # every worker's bitmap bit says whether it is in
        for a, (_, h, _) in got.items():
            assert (int(h["bitmap"]) >> net.leaf_of[a][1] & 1) == \
                (net.workers.index(a) in ins)
        np.testing.assert_array_equal(next(iter(got.values()))[2],
                                      sum((values(k, s) for k in ins), np.zeros(E, np.int64)))
        assert counts == {len(ins)}


def test_tree_entries_from_a_switch_toml(tmp_path):
    from ina_fabric.protocol.jobtable import load_jobs_toml
    p = tmp_path / "jobs.toml"
    p.write_text('[[job]]\nid = 3\nworkers = ["127.0.0.1:1", "127.0.0.1:2"]\n'
                 'parent = "127.0.0.1:19900"\nindex = 4\n'
                 '[[job]]\nid = 4\nworkers = ["127.0.0.1:3", "127.0.0.1:4"]\n'
                 'total_workers = 40\n')
    leaf, spine = load_jobs_toml(p)
    assert (leaf.parent, leaf.index, leaf.children, leaf.total) == \
        (("127.0.0.1", 19900), 4, False, 2)
    assert (spine.parent, spine.children, spine.total) == (None, True, 40)


def test_switch_flags_give_a_leaf_and_a_spine():
    from ina_fabric.host.cli import build_parser
    from ina_fabric.host.commands.switch import jobs_from_args
    p = build_parser()
    leaf, = jobs_from_args(p.parse_args(["switch", "--workers", "127.0.0.1:1,127.0.0.1:2",
                                         "--parent", "127.0.0.1:9", "--index", "3"]))
    assert (leaf.parent, leaf.index, leaf.children, leaf.total) == \
        (("127.0.0.1", 9), 3, False, 2)
    spine, = jobs_from_args(p.parse_args(["switch", "--workers", "127.0.0.1:1,127.0.0.1:2",
                                          "--total-workers", "40"]))
    assert (spine.parent, spine.children, spine.total) == (None, True, 40)
