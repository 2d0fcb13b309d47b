"""Bench of :class:`~ina_fabric.hw.ina.input_fifo.InputFifo`: datagrams in with idle
cycles (the FIFO's ``ready`` is the backpressure), pops at random, rewinds to a position
popped within the commit delay, ``hold``; every head beat against a model FIFO of the
accepted beats (``first`` made explicit, the datagram's time), ``avail`` against its
pointers, ``ready`` never taking a beat the FIFO has no room for."""

import cocotb

from ina_fabric.hw.ina.input_fifo import entry_layout, InputFifo
from ina_fabric.hw.ina.layout import in_layout
from ina_fabric.sim.bench import Bench, bench_params


@cocotb.test()
async def test_input_fifo(dut):
    p = bench_params()
    L, CD = p["lanes"], p["commit_delay"]
    b = Bench(dut, seed=p["seed"])
    src = b.source("i", in_layout(L), idle=p["idle"])
    ent = entry_layout(L)
    await b.reset(now=0, hold=0, pop=0, rewind_n=1, rewind_to=0)
    beats = []
    for _ in range(p["n"]):
        n = b.rng.randint(1, 5)
        meta = {"length": b.rng.getrandbits(16), "src_ip": b.rng.getrandbits(32),
                "src_port": b.rng.getrandbits(16), "src_mac": b.rng.getrandbits(48)}
        # (a datagram's first beat says so only sometimes: a beat after a last is first)
        beats += [{"data": b.rng.getrandbits(32 * L), "n": 1,
                   "first": int(j == 0 and b.rng.random() < 0.5), "last": int(j == n - 1),
                   **meta} for j in range(n)]
    src.send(beats)
    model, wp, rp = {}, 0, 0        # accepted entries by absolute index
    rps = [0] * (CD + 1)            # rp at the last falling edges (rewind targets)
    after_last, ts_in, popped = True, 0, 0
    for cyc in range(60 * len(beats) + 200):
        b.wr("now", b.cycle)
        hold = int(b.rng.random() < p.get("hold", 0.05))
        b.wr("hold", hold)
        await b.step()
        # a beat accepted at this edge (the source saw ``ready``)
        if len(src.sent) > wp:
            x = src.sent[wp]
            first = x["first"] or after_last
            if first:
                ts_in = b.cycle - 1
            model[wp] = {"data": x["data"], "first": int(first), "last": x["last"],
                         "length": x["length"], "src_ip": x["src_ip"],
                         "src_port": x["src_port"], "src_mac": x["src_mac"], "ts": ts_in}
            after_last = bool(x["last"])
            wp += 1
            assert wp - rps[-1] <= InputFifo.DEPTH, "a beat taken with the FIFO full"
        await b.settle()
        avail = b.rd("avail")
        assert avail == (rp != wp), f"cycle {b.cycle}: avail {avail}, rp {rp}, wp {wp}"
        assert b.rd("pop_ptr") == rp % 32
        pop, rew = 0, 1
        r = b.rng.random()
        if r < p.get("rewind", 0.05) and rp != rps[CD - 1]:
            k = b.rng.randint(0, CD - 1)
            b.wr("rewind_to", rps[k] % 32)
            rew, rp = 0, rps[k]
        elif avail and r < 1 - p.get("pop_idle", 0.3):
            head = b.rd("head", ent)
            assert head == model[rp], f"pop of entry {rp}: {head} != {model[rp]}"
            pop, rp = 1, rp + 1
            popped = max(popped, rp)
        b.wr("pop", pop)
        b.wr("rewind_n", rew)
        rps = [rp] + rps[:-1]
        if popped == len(beats) and src.done:
            break
    else:
        raise AssertionError(f"{popped} of {len(beats)} beats popped")
