"""Bench of :class:`~ina_fabric.hw.ina.element.ElementPath`: packets that open or add to
records (or do nothing), their element beats after the decision with random idle cycles
between them, the next packet to the same record as early as the core can send it (so
both forwarded writes are needed); every accumulator and overflow bit, read back through
the replicator's ports, against exact sums kept by the bench, and ``busy`` naming the
packet's record while its beats are in flight.

With narrow widths (``core.widths``) each packet has a random width (a record opened at
one width is added to at that width), its lane words hold 1, 2 or 4 elements (junk past
``nelem`` in the last word), and the replicator's port reads the sums saturated to the
width and packed, against the bench's exact sums clamped."""

import cocotb

from ina_fabric.hw.ina.element import beat_layout, packet_layout
from ina_fabric.hw.ina.lanes import Width, word_py, words_of
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
    # per (record, beat): each lane's exact element sums (one per element of the width)
    acc = {(r, e): [[0] for _ in range(L)] for r in range(R) for e in range(EB)}
    width = [32] * R            # the width each record was opened at
    bwidth = {key: 32 for key in acc}   # ... and each beat was last written at
    rnelem = [0] * R
    ovf = [0] * R
    joined = [P.workers] * R        # contributions since the record opened
    recs = list(range(R))[:p.get("records", 3)]
    mask = (1 << AB) - 1
    last = {}               # (record, beat): the cycle the bench last changed it
    reads = []              # reads in flight on the replicator's port: (edge, key, want)
    oreads = []             # ... on the overflow bits' port: (edge, record, want)

    def lanes_of(v):
        if P.narrow:
            return [(v >> (32 * j)) & 0xFFFFFFFF for j in range(L)]
        got = [(v >> (AB * j)) & mask for j in range(L)]
        return [g - (1 << AB) if g >> (AB - 1) else g for g in got]

    def want_of(key):
        """What the replicator's port reads: the exact sums (int32 only), or the sums
        saturated to the record's width and packed into lane words."""
        w = bwidth[key]
        if not P.narrow:
            return [s[0] for s in acc[key]]
        lo, hi = -(1 << (w - 1)), (1 << (w - 1)) - 1
        return [word_py([min(hi, max(lo, v)) for v in s], w) for s in acc[key]]

    async def step(n=1):
        """A cycle, with a read of a settled accumulator on the replicator's port beside
        the traffic (so a wrong sum is seen before a later packet overwrites it)."""
        for _ in range(n):
            await b.step()
            while reads and b.cycle - reads[0][0] >= 2:
                _, key, want = reads.pop(0)
                assert lanes_of(b.rd("acc_rd__data")) == want, \
                    f"cycle {b.cycle}: record {key[0]} beat {key[1]}: {lanes_of(b.rd('acc_rd__data'))} != {want}"
            while oreads and b.cycle - oreads[0][0] >= 2:
                _, r, want = oreads.pop(0)
                assert b.rd("ovf_rd__data") == want, f"cycle {b.cycle}: record {r}: overflow bit"
            stable = [k for k, t in last.items() if b.cycle - t >= 8]
            if stable and not reads:
                key = b.rng.choice(stable)
                b.wr("acc_rd__en", 1), b.wr("acc_rd__addr", key[0] * EB + key[1])
                reads.append((b.cycle, key, want_of(key)))
            settled = [r for r in recs if b.cycle - max((t for (q, _), t in last.items()
                                                          if q == r), default=-99) >= 8]
            if settled and not oreads:
                r = b.rng.choice(settled)
                b.wr("ovf_rd__en", 1), b.wr("ovf_rd__addr", r)
                oreads.append((b.cycle, r, ovf[r]))
    big = p.get("big", 0.2)
    for k in range(p["n"]):
        rec = b.rng.choice(recs)
        w = b.rng.choice(P.widths) if P.narrow else 32
        per = 32 // w
        nelem = b.rng.randint(1, P.elements)
        nb = -(-words_of(nelem, w) // L)
        mode = b.rng.choice([AccMode.OPEN, AccMode.ADD, AccMode.ADD, AccMode.NONE])
        if mode == AccMode.ADD and (joined[rec] >= P.workers or width[rec] != w):
            mode = AccMode.OPEN      # (a record takes at most N contributions: no wrap)
        if mode != AccMode.NONE:
            joined[rec] = 1 if mode == AccMode.OPEN else joined[rec] + 1
        if mode == AccMode.OPEN:
            width[rec], rnelem[rec] = w, nelem
        elif mode == AccMode.ADD and P.narrow:
            nelem = rnelem[rec]      # (as in the core: a record's packets have one nelem,
            nb = -(-words_of(nelem, w) // L)  # so no beat it did not open is added to)
        b.wr("start", 1)
        pkt = {"base": rec * EB, "rec": rec, "nelem": nelem, "nbeats": nb,
               "mode": mode.value}
        if P.narrow:
            pkt["width"] = Width.of_bits(w).value
        b.wr("packet", pkt, pl)
        b.wr("beat", 0)
        await step()
        b.wr("start", 0)
        run_ovf = 0
        for e in range(nb):
            while b.rng.random() < p["idle"]:
                b.wr("beat", 0)
                await step()
            top = 1 << (w - 1)
            lanes = [[(b.rng.choice((-1, 1)) * top + b.rng.randint(-5, 5))
                      if b.rng.random() < big else (b.rng.randint(-1000, 1000) if w == 32 else b.rng.randint(-top, top - 1))
                      for _ in range(per)] for _ in range(L)]
            lanes = [[max(-top, min(top - 1, v)) for v in lane] for lane in lanes]
            word = sum(word_py(lane, w) << (32 * j) for j, lane in enumerate(lanes))
            b.wr("beat", {"valid": 1, "elem": 1, "first": 0, "e": e, "data": word}, bl)
            await step()
            if mode != AccMode.NONE:
                if mode == AccMode.OPEN:
                    acc[rec, e] = [[0] * per for _ in range(L)]
                    bwidth[rec, e] = w
                cur = acc[rec, e]
                for j in range(L):
                    for i in range(per):
                        v = lanes[j][i] if (e * L + j) * per + i < nelem else 0
                        cur[j][i] = v if mode == AccMode.OPEN else cur[j][i] + v
                        run_ovf |= not -top <= cur[j][i] < top
                last[rec, e] = b.cycle
        if mode != AccMode.NONE:
            ovf[rec] = int(run_ovf)
        b.wr("beat", 0)
        if b.rng.random() < p["idle"]:
            await step(b.rng.randint(1, 4))
    b.wr("start", 0)
    await step(6)
    for (r, e) in acc:
        want = want_of((r, e))
        b.wr("acc_rd__en", 1), b.wr("acc_rd__addr", r * EB + e)
        await b.step()
        await b.settle()
        got = lanes_of(b.rd("acc_rd__data"))
        assert got == want, f"record {r} beat {e}: {got} != {want}"
    for r in range(R):
        b.wr("ovf_rd__en", 1), b.wr("ovf_rd__addr", r)
        await b.step()
        await b.settle()
        assert b.rd("ovf_rd__data") == ovf[r], f"record {r}: overflow bit"
