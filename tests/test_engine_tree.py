"""A two-level tree of compiled switches (``FastSwitchModel``, ``_engine.c``) against the
same tree of reference models (docs/fabric.md).

The same random traffic goes to both trees (``tree_net.TreeNet``, one seed): workers that
send out of order, lose and duplicate datagrams on every hop (worker-leaf and leaf-spine
alike), re-send what they have no RESULT of, straggle and come late, in every mode. Every
datagram that crosses a switch-to-switch link, every datagram a worker receives (time,
bytes) and every counter of every switch must be identical.
"""

import numpy as np
import pytest

from ina_fabric.host.switch.model import SwitchModel, COUNTERS
from ina_fabric.host.switch import fast
from ina_fabric.protocol import pack
from ina_fabric.protocol.fields import Flags, MsgType
from ina_fabric.protocol.jobtable import MODES

from tree_net import TreeNet, SPINE, leaf_addr

needs_engine = pytest.mark.skipif(not fast.available(), reason=fast.WHY_NOT or "")


def traffic(net, rng, nseq, E, garbage, widths=(32, 16, 8)):
    """Drive ``net`` with the traffic that ``rng`` (a fresh generator of one seed) draws:
    rounds of DATA in random order, some workers late or silent, re-sends, garbage.
    ``widths``: the element widths the seqs take (the RTL spine's test: int32 only)."""
    silent = {a for a in net.workers if rng.random() < 0.15}
    for rnd in range(4):
        for k in rng.permutation(net.n):
            a = net.workers[int(k)]
            if a in silent and rnd < 2:
                continue
            for s in rng.permutation(nseq):
                s = int(s)
                if rnd and s in net.results(a) and rng.random() < 0.8:
                    continue
                # issue 40: the seq's width (one per seq, as a controller changes it
                # call by call); now and then a worker disagrees (drop_bad_width)
                bits = widths[(s + net.width_salt) % len(widths)]
                if rng.random() < 0.02:
                    bits = int(rng.choice(list(widths)))
                lim = min(2**20, 1 << bits - 1)
                vals = rng.integers(-lim, lim, E)
                if rng.random() < 0.02:
                    vals[:] = (1 << bits - 1) - 1  # saturates somewhere up the tree
                net.send(a, s, vals, exponent=int(rng.integers(-3, 4)), retransmit=rnd > 0,
                         t=net.now + float(rng.random()) * 0.004, width=bits)
        if garbage:
            i = int(rng.integers(0, len(net.shape)))
            # a RESULT from someone who is not the parent, a stale one, a child DATA
            # claiming too many workers, a RESULT to the spine (which has no parent)
            junk = pack(np.ones(E, np.int64), type=MsgType.RESULT, job=net.cfg.job,
                        seq=int(rng.integers(0, nseq)), session=net.cfg.session,
                        count=int(rng.integers(0, 2000)), bitmap=int(rng.integers(0, 16)))
            net._put(net.now + 1e-4, leaf_addr(i), ("198.18.9.9", 19900), junk, False)
            net._put(net.now + 1e-4, leaf_addr(i), SPINE, junk, False)
            net._put(net.now + 1e-4, SPINE, leaf_addr(i), junk, False)
            over = pack(np.ones(E, np.int64), job=net.cfg.job, worker=i,
                        seq=int(rng.integers(0, nseq)), session=net.cfg.session,
                        count=net.cfg.total + 1)
            net._put(net.now + 1e-4, SPINE, leaf_addr(i), over, False)
        net.run(net.now + float(rng.choice([0.002, 0.02, 0.05])))
    net.run()


def run_tree(cls, seed):
    rng = np.random.default_rng(seed)
    shape = [int(x) for x in rng.integers(1, 6, int(rng.integers(1, 5)))]
    mode = str(rng.choice(MODES))
    E = int(rng.integers(1, 9))
    net = TreeNet(shape, cls=cls, loss=float(rng.choice([0.0, 0.05, 0.2])),
                  dup=float(rng.choice([0.0, 0.1])), seed=seed, mode=mode,
                  window=int(2 ** rng.integers(1, 4)), elements=E,
                  leaf_deadline=0.005, spine_deadline=0.015)
    net.width_salt = seed
    traffic(net, rng, int(rng.integers(1, 12)), E, garbage=rng.random() < 0.5)
    return net


@needs_engine
@pytest.mark.parametrize("seed", range(40))
def test_a_tree_of_engines_matches_a_tree_of_models(seed):
    model, engine = run_tree(SwitchModel, seed), run_tree(fast.FastSwitchModel, seed)
    assert engine.trunk == model.trunk
    assert engine.received == model.received
    for addr in model.switches:
        m, e = model.counters(addr), engine.counters(addr)
        assert {k: e[k] for k in COUNTERS} == {k: m[k] for k in COUNTERS}, addr
        mj, ej = (x.switches[addr].status()["jobs"] for x in (model, engine))
        assert ej == mj


@needs_engine
def test_the_random_trees_reach_every_tree_rule():
    seen = set()
    for seed in range(40):
        net = run_tree(SwitchModel, seed)
        for addr in net.switches:
            seen |= {k for k, v in net.counters(addr).items() if v}
    for rule in ("up", "up_resent", "relayed", "drop_result", "resent", "late",
                 "duplicates", "partials", "overflows", "drop_unknown_source",
                 "drop_malformed", "drop_stale"):
        assert rule in seen, rule


@needs_engine
def test_a_1024_worker_job_on_32_leaves_of_32():
    """The largest job: counts past 255 on the wire, every worker's RESULT says 1,024
    workers, and the compiled tree gives the model's bytes."""
    from ina_fabric.protocol import unpack
    nets = []
    for cls in (SwitchModel, fast.FastSwitchModel):
        net = TreeNet([32] * 32, cls=cls, elements=2, window=2)
        for k, a in enumerate(net.workers):
            net.send(a, 0, [k, -1], exponent=k % 7)
        net.run()
        nets.append(net)
    model, engine = nets
    assert engine.received == model.received and engine.trunk == model.trunk
    for a in model.workers:
        (t, d), = model.received[a]
        h, body = unpack(d)
        assert int(h["count"]) == 1024 and not int(h["flags"]) & Flags.PARTIAL
        assert body.tolist() == [sum(range(1024)), -1024] and int(h["exponent"]) == 6
