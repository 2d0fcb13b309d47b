"""Bench of :class:`~ina_fabric.hw.ina.replicator.Replicator`: random RESULT requests (group
and unicast re-sends, multicast and per-member jobs, partial, every element count from 0
to the core's) with random idle cycles, output backpressure, and each request's record
kept ``busy`` for a few cycles after it is queued (the element path still writing its
last packet: the accumulators and the overflow bit take their final values at the end,
so a copy that starts early shows stale sums). The bench answers the member table, the
accumulators and the overflow bits as synchronous read ports (the read's data from the
edge of an enabled read on).

The scoreboard is the reference model's RESULT (``host/switch/model.py``: the header,
the int32 clip and its OVERFLOW flag, ``_unicast`` for a re-send), laid out in beats
(:mod:`.beats`), with the L2/L3 sideband of each copy (member or multicast destination,
``ipv4_header``'s checksum, the length); ``done_hot`` must name each request's record once
after its last beat, in order, and ``overflow`` pulse once per group result with its
overflow bit set."""

import collections

import cocotb
import numpy as np
from amaranth.lib import data
from cocotb.triggers import RisingEdge

from host.switch.model import SwitchModel
from ina_fabric.hw.ina.layout import out_layout, request_layout
from ina_fabric.hw.ina.params import CoreParams
from ina_fabric.hw.ina.regfile import job_layout
from ina_fabric.hw.ina.replicator import ipv4_header
from ina_fabric.protocol.fields import GROUP_WORKER, HEADER_BYTES, Flags, MsgType
from ina_fabric.protocol.numpy_view import pack as pack_datagram
from ina_fabric.sim.bench import Bench, bench_params, pack, unpack
from ina_fabric.sim.ina.beats import datagram_beats

I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1


def _log2(n):
    return (n - 1).bit_length()


def rand_acc(rng, bits):
    """An accumulator value: small, or at and around the int32 limits, or anywhere."""
    k = rng.random()
    if k < 0.5:
        return rng.randrange(-1000, 1000)
    if k < 0.8 and bits > 32:
        return rng.choice((I32_MAX, I32_MAX + 1, I32_MIN, I32_MIN - 1)) + rng.choice((0, 0, -1, 1))
    return rng.randrange(-(1 << (bits - 1)), 1 << (bits - 1))


def edge_ip(rng, src_ip, nelem):
    """A destination whose header checksum (for a RESULT of ``nelem`` elements from
    ``src_ip``) has a carry out of the first fold: its 16-bit sum ends in 0xFFFF, with a
    carry above it (so a single fold is one short)."""
    total = 20 + 8 + HEADER_BYTES + 4 * nelem
    pre = 0x4500 + 0x4000 + ((64 << 8) | 17) + total + (src_ip >> 16) + (src_ip & 0xFFFF)
    hi = rng.randrange(0xE000, 0x10000)
    lo = (0xFFFF - (pre + hi)) & 0xFFFF
    return (hi << 16) | lo


def expected_beats(P, req, job, members, acc, ovf, src_ip):
    """The model's copies of one request: [(lane words, n, sideband)] per beat."""
    clipped = np.clip(np.array(acc, dtype=np.int64), I32_MIN, I32_MAX)
    flags = (Flags.PARTIAL if req["partial"] else 0) | (
        Flags.OVERFLOW if ovf and req["nelem"] else 0)
    exp = req["exponent"] - 256 if req["exponent"] & 0x80 else req["exponent"]
    result = pack_datagram(clipped.astype(np.int32), type=MsgType.RESULT, flags=flags,
                           exponent=exp, job=job["job_id"], worker=GROUP_WORKER,
                           count=req["count"], seq=req["seq"], bitmap=req["bitmap"],
                           session=(job["session_hi"] << 32) | job["session_lo"])
    assert len(result) == HEADER_BYTES + 4 * req["nelem"]
    if req["unicast"]:
        copies = [(SwitchModel._unicast(result, req["worker"]), members[req["worker"]], 0)]
    elif job["mcast_en"]:
        ip = job["mcast_ip"]
        mac = 0x01005E000000 | (ip & 0x7FFFFF)
        copies = [(result, (ip, job["mcast_port"], mac), 1)]
    else:
        copies = [(result, members[k], 0) for k in range(job["nworkers"])]
    out = []
    for dgram, (ip, port, mac), mcast in copies:
        hdr = ipv4_header(src_ip, ip, len(dgram))
        side = {"length": len(dgram), "dst_ip": ip, "dst_port": port, "dst_mac": mac,
                "mcast": mcast, "ip_checksum": int.from_bytes(hdr[10:12], "big")}
        beats = datagram_beats(dgram, P.lanes)
        for k, (words, n) in enumerate(beats):
            out.append((words[:n], n, {**side, "first": int(k == 0),
                                       "last": int(k == len(beats) - 1)}))
    return out


@cocotb.test()
async def test_replicator(dut):
    p = bench_params()
    P = CoreParams(**p["core"])
    L, NJ, R, EB, W = P.lanes, P.jobs, P.records, P.elem_beats, P.window
    WS = 1 << _log2(P.workers)
    AB = P.acc_bits
    b = Bench(dut, seed=p["seed"])
    rng = b.rng
    RL, OL, JL = request_layout(P), out_layout(L), job_layout()
    BL = data.StructLayout({"valid": 1, "rec": range(R)})
    src = b.source("req", RL, idle=p.get("idle", 0.3))
    snk = b.sink("o", OL, backpressure=p.get("bp", 0.3))
    # the job table, the member table, src_ip (fixed for the run)
    jobs = []
    for j in range(NJ):
        jobs.append({"job_id": rng.getrandbits(16), "nworkers": rng.randint(1, P.workers),
                     "bounded": rng.getrandbits(1), "log2_window": _log2(W),
                     "elements": P.elements, "deadline": rng.getrandbits(20),
                     "mcast_en": int(rng.random() < p.get("mcast", 0.3)),
                     "mcast_ip": 0xE0000000 | rng.getrandbits(28),
                     "mcast_port": rng.getrandbits(16), "enable": 1,
                     "session_hi": rng.getrandbits(32), "session_lo": rng.getrandbits(32)})
    JS = data.Layout.cast(JL).size
    src_ip = rng.getrandbits(32)
    # half the destinations make the header checksum's first fold carry (for one of the
    # element counts the requests favour), the other half are random
    nelems = (0, 1, P.elements)
    members = [(edge_ip(rng, src_ip, rng.choice(nelems)) if rng.random() < 0.5
                else rng.getrandbits(32), rng.getrandbits(16), rng.getrandbits(48))
               for _ in range(NJ * WS)]
    for j in jobs:
        if rng.random() < 0.5:
            j["mcast_ip"] = 0xE0000000 | (edge_ip(rng, src_ip, rng.choice(nelems)) & 0xFFFFFFF)
    acc = [[[0] * L for _ in range(EB)] for _ in range(R)]
    ovf = [0] * R
    b.wr("jobs", sum(pack(JL, jobs[j]) << (JS * j) for j in range(NJ)))
    b.wr("src_ip", src_ip)
    await b.reset(busy=0, member__data=0, acc__data=0, ovf__data=0)

    n = p["n"]
    made = taken = 0
    outstanding = set()             # records with a request made and not yet done
    busy = {}                       # record: cycles it stays busy
    reqs = collections.deque()      # taken requests, in order, with their final data
    snap = {}                       # record: its final accumulators and overflow bit
    done, want, want_done, overflows, want_overflows = [], [], [], 0, 0
    rd = {"member": None, "acc": None, "ovf": None}    # data of the last enabled read

    def word(name):
        v = rd[name]
        if v is None:
            return 0
        if name == "member":
            ip, port, mac = members[v]
            return ip | (port << 32) | (mac << 48)
        if name == "ovf":
            return ovf[v]
        rec, beat = divmod(v, EB)
        return sum((x & ((1 << AB) - 1)) << (AB * k) for k, x in enumerate(acc[rec][beat])) \
            if rec < R else 0

    def finish(rec):
        """The record's last packet is written: its final sums and overflow bit."""
        acc[rec] = [[rand_acc(rng, AB) for _ in range(L)] for _ in range(EB)]
        ovf[rec] = int(rng.random() < 0.5)
        snap[rec] = ([x for beat in acc[rec] for x in beat], ovf[rec])

    # at most: every copy of every request, at 1 / (1 - bp) beats a cycle, and the gaps
    cap = int(n * (P.workers * (P.header_beats + EB) + 60) / (1 - p.get("bp", 0.3))) + 2000
    for cyc in range(cap):
        if made < n and not src.q and rng.random() < 0.5:
            free = [r for r in range(R) if r not in outstanding]
            if free:
                rec = rng.choice(free)
                job = rng.randrange(NJ)
                nw = jobs[job]["nworkers"]
                req = {"rec": rec, "job": job, "unicast": int(rng.random() < p.get("unicast", 0.3)),
                       "worker": rng.randrange(nw), "seq": rng.getrandbits(32),
                       "count": rng.randint(0, nw), "bitmap": rng.getrandbits(P.workers),
                       "exponent": rng.getrandbits(8),
                       "nelem": rng.choice((0, 1, P.elements, rng.randint(0, P.elements))),
                       "partial": rng.getrandbits(1)}
                outstanding.add(rec)
                made += 1
                src.send([req])
        # the busy records (a record's busy starts the cycle after its request is taken)
        slots = [0] * 4
        for k, rec in zip(rng.sample(range(4), min(4, len(busy))), busy):
            slots[k] = pack(BL, valid=1, rec=rec)
        b.wr("busy", sum(s << (BL.size * k) for k, s in enumerate(slots)))
        for name in rd:
            b.wr(f"{name}__data", word(name))
        # one cycle: streams drive, the read ports' addresses settle, the edge
        for part in b.parts:
            part.before()
        await b.settle()
        en = {name: b.rd(f"{name}__en") for name in rd}
        addr = {name: b.rd(f"{name}__addr") for name in rd}
        await RisingEdge(b.clk)
        for part in b.parts:
            part.after()
        # what the edge sampled
        hot = b.rd("done_hot")
        if hot:
            assert hot & (hot - 1) == 0, f"cycle {cyc}: done_hot {hot:#x} not one-hot"
            rec = hot.bit_length() - 1
            done.append(rec)
            outstanding.discard(rec)
        overflows += b.rd("overflow")
        # the edge: reads (the memories before the writes), then the writes
        for name in rd:
            if en[name]:
                rd[name] = addr[name]
        for rec in list(busy):
            busy[rec] -= 1
            if busy[rec] <= 0:
                del busy[rec]
                finish(rec)
        while taken < len(src.sent):
            req = dict(src.sent[taken])
            taken += 1
            k = rng.choice((0, 0, 1, 2, 3, 5, 12, 30))
            if k:
                busy[req["rec"]] = k
            else:
                finish(req["rec"])
            reqs.append(req)
        # the expected copies of every request whose data is final
        while reqs and reqs[0]["rec"] in snap and reqs[0]["rec"] not in busy:
            req = reqs.popleft()
            a, o = snap.pop(req["rec"])
            members_j = [members[req["job"] * WS + k if WS > 1 else req["job"]]
                         for k in range(P.workers)]
            want += expected_beats(P, req, jobs[req["job"]], members_j, a[:req["nelem"]], o,
                                   src_ip)
            want_overflows += int(o and req["nelem"] and not req["unicast"])
            want_done.append(req["rec"])
        if len(done) == n and not reqs and len(snk.got) >= len(want):
            break
    assert len(done) == n, f"{len(done)} of {n} requests done after {cyc} cycles"
    assert done == want_done, "done_hot's records out of order"
    assert len(snk.got) == len(want), f"{len(snk.got)} beats out, {len(want)} expected"
    for k, (got, (words, nw, side)) in enumerate(zip(snk.got, want)):
        lanes = [(got["data"] >> (32 * i)) & 0xFFFFFFFF for i in range(nw)]
        g = {f: got[f] for f in side}
        assert (got["n"], lanes, g) == (nw, words, side), \
            f"beat {k}: got n={got['n']} {lanes} {g}, want n={nw} {words} {side}"
    assert overflows == want_overflows, f"overflow pulses {overflows} != {want_overflows}"
