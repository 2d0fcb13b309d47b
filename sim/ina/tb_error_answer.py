"""Bench of :class:`~ina_fabric.hw.ina.answer.ErrorAnswer`: packets captured at random
FIFO positions (random job, worker, seq, session, source, time lagging the clock), their
refusals a cycle or more later (every kind, none, slots opened, a job's position reset),
with idle cycles, the clock crossing 2^32 (the 64-bit time), output backpressure, and
the bench honouring ``stop`` as the header pipeline does (a few refusals still come
after it). Each ERROR against the reference model's (``SwitchModel._refuse``: the
bucket hash, the rate limit, the datagram), in order, with its destination, MAC, length
and IPv4 checksum; ``sent`` and ``limited`` against the model's counters."""

import collections
import ipaddress

import cocotb

from ina_fabric.host.switch.model import SwitchModel
from ina_fabric.hw.ina.answer import Kind, capture_layout, refusal_layout, REASON
from ina_fabric.hw.ina.layout import out_layout
from ina_fabric.hw.ina.params import CoreParams
from ina_fabric.hw.ina.regfile import job_layout
from ina_fabric.hw.ina.replicator import ipv4_header
from ina_fabric.protocol.numpy_view import pack as pack_dgram
from ina_fabric.sim.bench import Bench, bench_params, pack
from ina_fabric.sim.ina.beats import beats_datagram

SRC_IP = 0x0A0000FE


@cocotb.test()
async def test_error_answer(dut):
    p = bench_params()
    P = CoreParams(**p["core"])
    NJ, L = P.jobs, P.lanes
    b = Bench(dut, seed=p["seed"])
    CL, RL, OL = capture_layout(), refusal_layout(P), out_layout(L)
    snk = b.sink("o", OL, backpressure=p["bp"])
    rng = b.rng
    jobs = [{"job_id": 100 + j, "nworkers": rng.randint(1, P.workers),
             "elements": rng.randint(1, P.elements), "enable": 1} for j in range(NJ)]
    jl = job_layout()
    jobs_val = 0
    for j, jv in enumerate(jobs):
        jobs_val |= pack(jl, jv) << (j * jl.size)
    start = (1 << 32) - p["before_wrap"]       # the clock crosses 2^32 mid-run
    await b.reset(cap=0, refusal=0, jobs=jobs_val, reset_pos=0, now=start & 0xFFFFFFFF,
                  src_ip=SRC_IP)
    # (the reset took cycles: the clock the block sees from here is ``start + cyc``)
    model = SwitchModel(error_interval=p["interval"])
    srcs = [(f"10.0.{k // 4}.{k + 1}", 5000 + k) for k in range(p["sources"])]
    head = [0] * NJ
    pending = collections.deque()   # captured packets: (pos, fields, abs time, cycle)
    expected = []
    pos, last_ts, stop_seen, after_stop, stops = 0, start, 0, 0, 0
    last_ref, quiet_until = -10, -1
    sent = limited = 0
    for cyc in range(p["n"]):
        now = start + cyc
        b.wr("now", now & 0xFFFFFFFF)
        cap = {"valid": 0}
        if len(pending) < 8 and rng.random() < p["packets"]:
            ip, port = rng.choice(srcs)
            ts = max(last_ts, now - rng.randint(0, 40))
            last_ts = ts
            f = {"valid": 1, "pos": pos, "job": rng.choice([100, 101, 7777]),
                 "worker": rng.randrange(256), "seq": rng.getrandbits(32),
                 "session": rng.getrandbits(64), "ts": ts & 0xFFFFFFFF,
                 "sip": int(ipaddress.IPv4Address(ip)), "sport": port,
                 "smac": rng.getrandbits(48)}
            f["seq1"] = (f["seq"] + 1) & 0xFFFFFFFF
            cap = f
            pending.append((pos, f, ts, cyc, (ip, port)))
            pos = (pos + 1) % 16
        b.wr("cap", cap, CL)
        ref = {"kind": Kind.NONE.value}
        hold = stop_seen and after_stop >= 4      # the header pipeline has stopped
        if (pending and pending[0][3] < cyc and not hold and cyc > quiet_until
                and rng.random() >= p["idle"]):
            ppos, f, ts, _, src = pending.popleft()
            kind = rng.choice(list(Kind))
            j = rng.randrange(NJ)
            opened = int(kind == Kind.NONE and rng.random() < 0.5)
            slot_nelem = rng.randint(0, P.elements)
            ref = {"kind": kind.value, "opened": opened, "pos": ppos, "job": j,
                   "slot_nelem": slot_nelem}
            if stop_seen:
                after_stop += 1
            if opened and ((f["seq1"] - head[j]) & 0xFFFFFFFF) < 1 << 31:
                head[j] = f["seq1"]
            if kind != Kind.NONE:
                figure = {Kind.NOT_MEMBER: jobs[j]["nworkers"],
                          Kind.BIG_NELEM: jobs[j]["elements"], Kind.STALE: head[j],
                          Kind.SLOT_NELEM: slot_nelem}.get(kind, 0)
                d = pack_dgram([], job=f["job"], worker=f["worker"], seq=f["seq"],
                               session=f["session"], exponent=rng.randrange(-128, 128),
                               flags=rng.randrange(16))
                expected += [(dst, out, f["smac"]) for dst, out in
                             model._refuse(REASON[kind], figure, d, src, ts)]
        b.wr("refusal", ref, RL)
        if ref["kind"] != Kind.NONE.value or ref.get("opened"):
            last_ref = cyc
        rp = 0
        # a job's position reset (an install), with no refusal in the block's first
        # stages (as in the core, where an install holds the input while it lands)
        if rng.random() < p["resets"] and cyc - last_ref > 2:
            rj = rng.randrange(NJ)
            rp = 1 << rj
            head[rj] = 0
            quiet_until = cyc + 2
        b.wr("reset_pos", rp)
        await b.step()
        sent += b.rd("sent")
        limited += b.rd("limited")
        if b.rd("stop"):
            stop_seen, stops = 1, stops + 1
        else:
            stop_seen, after_stop = 0, 0
    b.wr("cap", {"valid": 0}, CL)
    b.wr("refusal", {"kind": 0}, RL)
    b.wr("reset_pos", 0)
    n_beats = len(expected) * P.header_beats
    for k in range(p["drain"]):
        b.wr("now", (start + p["n"] + k) & 0xFFFFFFFF)
        await b.step()
        sent += b.rd("sent")
        limited += b.rd("limited")
        if len(snk.got) == n_beats and k > 40:
            break
    got = []
    for i in range(0, len(snk.got), P.header_beats):
        beats = snk.got[i:i + P.header_beats]
        got.append((beats, beats_datagram(beats, L)[:beats[0]["length"]]))
    assert len(got) == len(expected), f"{len(got)} ERRORs, the model {len(expected)}"
    for k, ((beats, dgram), (dst, want, mac)) in enumerate(zip(got, expected)):
        s = beats[0]
        assert dgram == want, f"ERROR {k}: {dgram.hex()} != model {want.hex()}"
        assert (str(ipaddress.IPv4Address(s["dst_ip"])), s["dst_port"]) == dst, k
        assert s["dst_mac"] == mac and not s["mcast"] and s["length"] == 28, k
        ck = int.from_bytes(ipv4_header(SRC_IP, s["dst_ip"], 28)[10:12], "big")
        assert s["ip_checksum"] == ck, f"ERROR {k}: IPv4 checksum"
        assert [x["first"] for x in beats] == [1] + [0] * (len(beats) - 1)
        assert [x["last"] for x in beats] == [0] * (len(beats) - 1) + [1]
    c = model.counters
    assert (sent, limited) == (c["errors_sent"], c["errors_limited"]), \
        (sent, limited, dict(c))
    assert sent and limited, "the run must both answer and limit"
    dut._log.info(f"error answer: {sent} sent, {limited} limited, stop held {stops} cycles")
    if p.get("must_stop"):
        assert stops, "the queue never filled: stop untested"
