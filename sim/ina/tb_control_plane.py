"""Bench of :class:`~ina_fabric.hw.ina.control.ControlPlane`, its five blocks joined: the
in-band control scenario (:mod:`.control_scenario`: installs, live updates, replays,
other keys, altered tags, malformed entries and lengths, a full table, other sessions'
installs, updates and removals, STATUS requests answered, unauthenticated and too long,
mixed with DATA) snooped as the core's input beats (with random idle cycles between
beats), then two CONTROLs back to back (the second is ``drop_control_busy``), against
the reference model with the same key (:class:`.scoreboard.Scoreboard`, 1 cycle per us).

The bench is the rest of the core: the register file (the bus writes land
``WRITE_LATENCY`` cycles later, the job initializer sets ``enable`` a few cycles after
a write of 1; the member table's synchronous read port), DATA ``accepted`` pulses (a
job's idle time) where the model accepts DATA, the counters (the control plane's own
events as the core's counters count them, the model's for the rest), and the output
under random backpressure.

Checks: each reply, sealed (same key and nonce), to the same destination as the model's,
in order (a STATUS page as the model's, for what the core keeps); its L2/L3 sideband
(the request's source MAC, ``ipv4_header``'s checksum); every counter event the control
plane raises against the model's counter after each datagram; the job table the writes
leave against the model's installed jobs."""

import collections
import ipaddress

import cocotb
from amaranth.lib import data
from cocotb.triggers import RisingEdge

from ina_fabric.hw.ina.control import CONTROL_EVENTS
from ina_fabric.hw.ina.layout import in_layout, out_layout
from ina_fabric.hw.ina.params import CoreParams
from ina_fabric.hw.ina.regfile import job_layout
from ina_fabric.hw.ina.replicator import ipv4_header
from ina_fabric.protocol.fields import HEADER_BYTES, MsgType
from ina_fabric.protocol.regs import (COUNTER_NAMES, JOB_BASE, JOB_REGS, JOB_STRIDE,
                                      MEMBER_BASE, MEMBER_REGS, WRITE_LATENCY)
from ina_fabric.sim.bench import Bench, bench_params, pack
from ina_fabric.sim.ina.beats import Packer, beats_datagram, in_payloads, source_mac
from ina_fabric.sim.ina.control_scenario import KEY, busy_pair, scenario
from ina_fabric.sim.ina.scoreboard import Scoreboard

WIDTH = {r.name: r.width for r in JOB_REGS}
MREG = {r.name: r.offset for r in MEMBER_REGS}
BUS = data.StructLayout({"addr": 16, "w_stb": 1, "w_data": 32})
EVENTS = data.StructLayout(CONTROL_EVENTS)
SRC_IP = "10.0.0.254"       # the scoreboard's
WATCH = ("control", "control_refused", "drop_unauthenticated", "drop_malformed",
         "status_requests", "status_unpadded")


def _log2(n):
    return (n - 1).bit_length()


def collect_replies(snk, beats, replies, L, src_ip, mac):
    """The output's new beats into ``beats``; each reply they complete, its sideband
    checked (to ``mac``), into ``replies`` as (destination, datagram)."""
    while len(snk.got) > len(beats):
        g = snk.got[len(beats)]
        beats.append(g)
        if g["last"]:
            first = max(i for i, x in enumerate(beats) if x["first"])
            pk = beats[first:]
            dgram = beats_datagram(pk, L)
            dgram = dgram[:pk[0]["length"]]
            for x in pk:
                ck = int.from_bytes(ipv4_header(src_ip, x["dst_ip"], len(dgram))[10:12],
                                    "big")
                assert (x["length"], x["ip_checksum"], x["mcast"], x["dst_mac"]) == \
                    (len(dgram), ck, 0, mac), f"reply sideband {x}"
            dst = (str(ipaddress.IPv4Address(pk[0]["dst_ip"])), pk[0]["dst_port"])
            replies.append((dst, dgram))


def check_jobs(table, model):
    """The job table the writes leave against the model's installed jobs."""
    got = {t["job_id"]: t for t in table if t["enable"]}
    assert set(got) == set(model.jobs), f"jobs {sorted(got)} != {sorted(model.jobs)}"
    for job, js in model.jobs.items():
        cfg, t = js.cfg, got[job]
        assert (t["nworkers"], 1 << t["log2_window"], t["elements"],
                (t["session_hi"] << 32) | t["session_lo"], t["bounded"]) == \
            (cfg.n, cfg.window, cfg.elements, cfg.session, int(cfg.mode == "bounded")), \
            f"job {job}: table {t} != {cfg}"


@cocotb.test()
async def test_control_plane(dut):
    p = bench_params()
    P = CoreParams(**p["core"])
    NJ, L = P.jobs, P.lanes
    WS = 1 << _log2(P.workers)
    b = Bench(dut, seed=p["seed"])
    rng = b.rng
    JL = job_layout()
    JS = data.Layout.cast(JL).size
    SN = data.StructLayout({"valid": 1, "payload": in_layout(L)})
    inp = Packer(in_layout(L))
    snk = b.sink("o", out_layout(L), backpressure=p.get("bp", 0.3))
    sb = Scoreboard([], key=KEY, time_scale=1e-6, max_jobs=NJ)
    src_ip = int(ipaddress.IPv4Address(SRC_IP))
    table = [{r.name: 0 for r in JOB_REGS} for _ in range(NJ)]
    members = [(0, 0, 0)] * (NJ * WS)
    st = {"mac_hi": 0, "member": None, "now": 0}
    pending, init_due = [], {}
    ev = collections.Counter()          # the control plane's events, counted
    replies = []                        # (dst, datagram) sent
    beats = []

    def apply(addr, v):
        if addr >= MEMBER_BASE:
            a = addr - MEMBER_BASE
            idx = (a >> 7) * WS + ((a >> 2) & 31) if WS > 1 else a >> 7
            ip, port, mac = members[idx]
            k = a & 3
            if k == MREG["ip"]:
                members[idx] = (v, port, mac)
            elif k == MREG["port"]:
                members[idx] = (ip, v & 0xFFFF, mac)
            elif k == MREG["mac_hi"]:
                st["mac_hi"] = v & 0xFFFF
            else:
                members[idx] = (ip, port, (st["mac_hi"] << 32) | v)
            return
        j, off = divmod(addr - JOB_BASE, JOB_STRIDE)
        name = JOB_REGS[off].name
        if name == "enable":
            table[j]["enable"] = 0
            init_due.pop(j, None)
            if v & 1:
                init_due[j] = rng.randint(2 * P.window + 2, 4 * P.window + 8)
        else:
            table[j][name] = v & ((1 << WIDTH[name]) - 1)

    async def cycle(snoop=None, accepted=0):
        mc = sb.model.counters
        counters = [ev[n] if n in CONTROL_EVENTS else mc.get(n, 0) for n in COUNTER_NAMES]
        b.wr("counters", sum((c & 0xFFFFFFFF) << (32 * k) for k, c in enumerate(counters)))
        b.wr("jobs", sum(pack(JL, table[j]) << (JS * j) for j in range(NJ)))
        b.wr("snoop", (snoop << 1 | 1) if snoop is not None else 0)
        b.wr("accepted", accepted)
        if st["member"] is not None:
            ip, port, mac = st["member"]
            b.wr("member__data", ip | (port << 32) | (mac << 48))
        await b.step()
        st["now"] += 1
        bus = b.rd("bus", BUS)
        assert b.rd("bus_active") == bus["w_stb"]
        for k, v in b.rd("events", EVENTS).items():
            ev[k] += bin(v).count("1")
        if b.rd("member__en"):
            st["member"] = members[b.rd("member__addr")]
        for j in list(init_due):
            init_due[j] -= 1
            if init_due[j] == 0:
                del init_due[j]
                table[j]["enable"] = 1
        for w in pending:
            w[0] -= 1
        for w in [w for w in pending if w[0] == 0]:
            pending.remove(w)
            apply(w[1], w[2])
        if bus["w_stb"]:
            pending.append([WRITE_LATENCY, bus["addr"], bus["w_data"]])
        collect_replies(snk, beats, replies, L, src_ip, st["mac"])

    st["mac"] = None
    await b.reset(snoop=0, jobs=0, accepted=0, member__data=0, src_ip=src_ip, counters=0)

    async def send(dg, src):
        """The datagram's beats on the snoop port, with idle cycles between them."""
        pl = in_payloads(dg, src, L, inp)       # (with the source's MAC: source_mac)
        if len(dg) < 2 or dg[1] != MsgType.DATA:
            st["mac"] = source_mac(src)          # where its reply must go
        t0 = None
        for k, x in enumerate(pl):
            while rng.random() < p.get("idle", 0.3):
                await cycle()
            t0 = st["now"] if t0 is None else t0
            await cycle(snoop=x)
        return t0

    traffic, gaps, expect = scenario(NJ)
    n = min(p["n"], len(traffic))
    names = {j: None for j in range(NJ)}
    for k, (dg, src) in enumerate(traffic[:n]):
        before = sb.model.counters.get("accepted", 0)
        t0 = await send(dg, src)
        sb.packet(dg, src, t0)
        acc = 0
        if sb.model.counters.get("accepted", 0) > before and len(dg) >= HEADER_BYTES:
            job = int.from_bytes(dg[4:6], "big")
            acc = sum(1 << j for j in range(NJ)
                      if table[j]["enable"] and table[j]["job_id"] == job)
        await cycle(accepted=acc)
        # done when the core has done what the model did: the same events and replies
        want_replies = len(sb.expected.get(("reply", 0), []))
        mc = sb.model.counters
        for c in range(p.get("timeout", 40000)):
            if len(replies) == want_replies and all(ev[x] == mc.get(x, 0) for x in WATCH):
                break
            await cycle()
        else:
            raise AssertionError(
                f"datagram {k} ({dg[:28].hex()}...): after {c} cycles, core events "
                f"{ {x: ev[x] for x in WATCH} } replies {len(replies)}, model "
                f"{ {x: mc.get(x, 0) for x in WATCH} } replies {want_replies}")
        for _ in range(8):
            await cycle()
        assert all(ev[x] == mc.get(x, 0) for x in WATCH), \
            f"datagram {k}: core events { {x: ev[x] for x in WATCH} } != model"
        sb.tick(st["now"])
    want = sb.expected.get(("reply", 0), [])
    assert sb._same(("reply", 0), want, replies), \
        f"replies differ: model {[(d, o[:60]) for d, o in want]}, core " \
        f"{[(d, o[:60]) for d, o in replies]}"
    # the job table against the model's installed jobs
    while pending or init_due:
        await cycle()
    check_jobs(table, sb.model)
    if n == len(traffic):
        c = sb.model.counters
        assert all(c[k] == v for k, v in expect.items()), "the scenario's counts"
        # two CONTROLs back to back: the second is dropped while the first is processed
        ctl0 = ev["control"]
        for dg, src in busy_pair():
            await send(dg, src)
        for c in range(40000):
            await cycle()
            if ev["control"] > ctl0 and len(replies) > len(want):
                break
        assert (ev["control"] - ctl0, ev["drop_control_busy"]) == (1, 1), dict(ev)
    dut._log.info(f"{n} datagrams, {len(replies)} replies, events {dict(ev)}, "
                  f"{st['now']} cycles")
