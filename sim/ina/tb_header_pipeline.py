"""Bench of :class:`~ina_fabric.hw.ina.header.HeaderPipeline`, the six stages joined:
seeded DATA traffic of two jobs (a reliable one and a bounded one with deadlines:
loss, duplicates, late and re-sent packets, unknown jobs, sources, sessions, truncated
and malformed datagrams, garbage; :mod:`.traffic`) against the reference model
(``host/switch/model.py`` through :class:`.scoreboard.Scoreboard`, in cycles).

The bench is the rest of the core, as cycle models of its contracts: the input FIFO
(:class:`~.input_fifo.InputFifo`: 16 entries, ``ready`` a cycle late with one to spare
and low while ``hold``, the head read asynchronously, ``avail`` registered, the pop
pointer rewound by ``rewind_n``/``rewind_to`` and the commit pointer ``DEC_LAT`` pops
behind), with random idle cycles on its input; the register file (the job table from
``config_writes``, each job enabled through the ``enable_stb``/``enable_set``
handshake, the member table's asynchronous read ports); the request queue and the
pending counts (``queue_level`` and ``pending`` registered), drained by a replicator
that takes a request now and then and spends a random time sending it (backpressure:
the queue fills, ``q_stop`` holds the pops, and records wait while their result is
pending).

Checks: every request, as the RESULT header it becomes (job id, flags but OVERFLOW,
which the element path decides; worker, count, seq, nelem, bitmap, exponent, session),
equals the model's results slot by slot (a group result once, a re-send per worker);
every counter event the pipeline raises sums to the model's counter; the request queue
never holds more than its depth."""

import collections

import cocotb
import numpy as np
from amaranth.lib import data
from cocotb.triggers import RisingEdge

from ina_fabric.hw.ina.input_fifo import entry_layout
from ina_fabric.hw.ina.layout import request_layout
from ina_fabric.hw.ina.params import CoreParams
from ina_fabric.hw.ina.regfile import job_layout, member_layout
from ina_fabric.hw.ina.slot import DEC_LAT, HEADER_EVENTS
from ina_fabric.protocol.fields import GROUP_WORKER, HEADER_BYTES, VERSION, Flags, MsgType
from ina_fabric.protocol.numpy_view import HEADER_DTYPE
from ina_fabric.protocol.numpy_view import pack as pack_datagram
from ina_fabric.protocol.regs import (JOB_BASE, JOB_REGS, JOB_STRIDE, MEMBER_BASE,
                                      config_writes)
from ina_fabric.sim.bench import Bench, bench_params, pack, unpack
from ina_fabric.sim.ina.beats import datagram_beats
from ina_fabric.sim.ina.scoreboard import Scoreboard, ERRORS
from ina_fabric.sim.ina.traffic import Mix, generate, make_jobs

FD = 16
WIDTH = {r.name: r.width for r in JOB_REGS}


def _log2(n):
    return (n - 1).bit_length()


def _ip(s):
    return int.from_bytes(bytes(int(x) for x in s.split(".")), "big")


def header_of(req, t):
    """The RESULT header a request becomes (``t``: its job's table entry), as bytes."""
    flags = (Flags.PARTIAL if req["partial"] else 0) | (
        Flags.RETRANSMIT if req["unicast"] else 0)
    exp = req["exponent"] - 256 if req["exponent"] & 0x80 else req["exponent"]
    return pack_datagram(None, type=MsgType.RESULT, flags=flags, exponent=exp,
                         job=t["job_id"], worker=req["worker"] if req["unicast"] else GROUP_WORKER,
                         count=req["count"], seq=req["seq"], nelem=req["nelem"],
                         bitmap=req["bitmap"],
                         session=(t["session_hi"] << 32) | t["session_lo"])


def register_tables(jobs, P, WS):
    """The register file's tables, from the host's register writes: (the job table, the
    member table)."""
    NJ = P.jobs
    table = [{r.name: 0 for r in JOB_REGS} for _ in range(NJ)]
    members = [(0, 0)] * (NJ * WS)
    for j, cfg in enumerate(jobs):
        # (as the core's bench: a bounded job's deadline in cycles, none for reliable)
        dl = max(1, round(cfg.deadline)) if cfg.mode == "bounded" else 1 << 30
        for addr, v in config_writes(cfg, j, clock_hz=1.0, window_max=P.window,
                                     elements_max=P.elements, workers_max=P.workers,
                                     deadline_cycles=dl):
            if addr >= MEMBER_BASE:
                a = addr - MEMBER_BASE
                idx, k = (a >> 7) * WS + ((a >> 2) & 31), a & 3
                ip, port = members[idx]
                members[idx] = (v, port) if k == 0 else (ip, v) if k == 1 else (ip, port)
            else:
                jj, off = divmod(addr - JOB_BASE, JOB_STRIDE)
                name = JOB_REGS[off].name
                if name != "enable":
                    table[jj][name] = v & ((1 << WIDTH[name]) - 1)
    return table, members


async def enable_jobs(cycle, table, n, P):
    """Enable each of the ``n`` jobs: the initializer resets its records, then
    ``enable_set``."""
    for j in range(n):
        await cycle(enable_stb=1 << j)
        for _ in range(4 * P.window * 2 + 50):
            await cycle()
            if table[j]["enable"]:
                break
        assert table[j]["enable"], f"job {j} not enabled"
        for _ in range(4):
            await cycle()


def check_results(sb, got):
    """The model's results, a header each (a group result once; OVERFLOW cleared), against
    the pipeline's requests (``got``), slot by slot; returns the slots."""
    want = collections.defaultdict(list)
    for key, outs in sb.expected.items():
        if key == ERRORS:       # (the answers to refused DATA: the core's ErrorAnswer,
            continue            # fed by this pipeline's ``refusal``; its own bench)
        last = None
        for dest, out in outs:
            h = bytearray(out[:HEADER_BYTES])
            h[2] &= ~Flags.OVERFLOW & 0xFF
            rec = np.frombuffer(bytes(h), HEADER_DTYPE, count=1)[0]
            if int(rec["worker"]) == GROUP_WORKER and last is not None and \
                    bytes(h) == last[0] and last[1] > 1:
                last = (last[0], last[1] - 1)
                continue
            cfg = sb.jobs[int(rec["job"])]
            copies = 1 if (cfg.mcast or int(rec["worker"]) != GROUP_WORKER) else cfg.n
            last = (bytes(h), copies)
            want[key].append(bytes(h))
    keys = sorted(set(want) | set(got))
    bad = [k for k in keys if want.get(k, []) != got.get(k, [])]
    assert not bad, (f"{len(bad)} of {len(keys)} slots differ; first {bad[0]}: model "
                     f"{[h.hex() for h in want.get(bad[0], [])]}, pipeline "
                     f"{[h.hex() for h in got.get(bad[0], [])]}; inputs "
                     f"{sb.history.get(bad[0])}")
    return keys


def check_events(sb, traffic, events):
    """Every counter event the pipeline raised (``events``) against the model's counter."""
    # (the model's drop_malformed also counts the CONTROL datagrams, which the pipeline
    # drops uncounted: the control plane counts them, a core with no key as malformed)
    c = dict(sb.model.counters)
    c["drop_malformed"] -= sum(1 for d, _ in traffic if len(d) >= HEADER_BYTES
                               and d[0] == VERSION and d[1] == MsgType.CONTROL)
    diff = {n: (events[n], c[n]) for n in HEADER_EVENTS if n in c and events[n] != c[n]}
    assert not diff, f"counter events differ (pipeline, model): {diff}"


@cocotb.test()
async def test_header_pipeline(dut):
    p = bench_params()
    P = CoreParams(**p["core"])
    NJ, L, WS = P.jobs, P.lanes, 1 << _log2(P.workers)
    b = Bench(dut, seed=p["seed"])
    rng = b.rng
    jobs = make_jobs(n_a=p.get("n_a", 4), n_b=p.get("n_b", 3), window=p.get("window", 2),
                     elements=p.get("elements", P.elements),
                     deadline_cycles=p.get("deadline", 300))
    sb = Scoreboard(jobs)
    # the register file's tables, from the host's register writes
    table, members = register_tables(jobs, P, WS)
    JL, EL, RL = job_layout(), entry_layout(L), request_layout(P)
    JS = data.Layout.cast(JL).size
    ML = member_layout(mac=False)
    EVL = data.StructLayout(HEADER_EVENTS)

    # the input FIFO's state
    fifo = [unpack(EL, 0)] * FD
    wp = rp = 0
    rp_d = [0] * DEC_LAT
    avail, in_room = 0, 1
    in_pkt, ts_in = 0, 0
    # the request queue, the replicator and the pending counts
    queue = collections.deque()
    sending = None          # (request, cycles left)
    pend = [0] * P.records
    level = 0
    got = collections.defaultdict(list)
    events = collections.Counter()
    now = 0

    async def cycle(push_beat=None, enable_stb=0):
        """One cycle; returns whether ``push_beat`` (a FIFO entry dict) was taken."""
        nonlocal wp, rp, avail, in_room, in_pkt, ts_in, level, sending, now
        b.wr("jobs", sum(pack(JL, table[j]) << (JS * j) for j in range(NJ)))
        b.wr("now", now)
        b.wr("head", pack(EL, fifo[rp % FD]))
        b.wr("avail", avail)
        b.wr("pop_ptr", rp)
        b.wr("queue_level", level)
        b.wr("pending", sum(int(c != 0) << r for r, c in enumerate(pend)))
        b.wr("enable_stb", enable_stb)
        b.wr("enable_value", 1)
        await b.settle()
        for j in range(NJ):       # the member tables: asynchronous reads
            a = b.rd(f"member__{j}__addr")
            ip, port = members[a] if a < len(members) else (0, 0)
            b.wr(f"member__{j}__data", pack(ML, ip=ip, port=port))
        await RisingEdge(b.clk)
        o = {k: b.rd(k) for k in ("pop", "rewind_n", "rewind_to", "hold", "push_a",
                                  "push_b", "push_hot", "enable_set")}
        reqs = [unpack(RL, b.rd(x)) for x, v in (("a", o["push_a"]), ("b", o["push_b"])) if v]
        for k, v in b.rd("events", EVL).items():
            events[k] += bin(v).count("1")      # (one bit per event)
        # the edge, in the models
        took = bool(push_beat is not None and in_room)
        room = int((wp - rp_d[-1]) % 32 < FD - 1 and not o["hold"])
        if took:
            first = push_beat["first"] or not in_pkt
            ent = dict(push_beat, first=int(first), ts=now if first else ts_in)
            fifo[wp % FD] = ent
            if first:
                ts_in = now
            in_pkt = 1 - ent["last"]
            wp = (wp + 1) % 32
        in_room = room
        old_rp = rp
        if o["pop"]:
            assert avail, f"cycle {now}: pop without avail"
            rp = (rp + 1) % 32
        rp_d[1:] = rp_d[:-1]
        rp_d[0] = old_rp
        if not o["rewind_n"]:
            rp = o["rewind_to"]
            rp_d[:] = [o["rewind_to"]] * DEC_LAT
        avail = int(rp != wp)
        for j in range(NJ):
            if o["enable_set"] >> j & 1:
                table[j]["enable"] = 1
        # requests: the queue (level registered), pending counts, the replicator
        for req in reqs:
            queue.append(req)
            got[(table[req["job"]]["job_id"], req["seq"])].append(header_of(req, table[req["job"]]))
        if reqs:
            assert o["push_hot"] == 1 << reqs[0]["rec"], f"cycle {now}: push_hot"
            pend[reqs[0]["rec"]] += len(reqs)
        popped = 0
        if sending is None and level and rng.random() < p.get("drain", 0.3):
            sending = [queue.popleft(), rng.randint(1, p.get("send_cycles", 12))]
            popped = 1
        elif sending is not None:
            sending[1] -= 1
            if sending[1] == 0:
                pend[sending[0]["rec"]] -= 1
                sending = None
        level = level + len(reqs) - popped
        assert level == len(queue) and level <= P.queue, \
            f"cycle {now}: the request queue holds {len(queue)} > {P.queue}"
        now += 1
        return took

    await b.reset(jobs=0, now=0, head=0, avail=0, pop_ptr=0, queue_level=0, pending=0,
                  enable_stb=0, enable_value=0,
                  **{f"member__{j}__data": 0 for j in range(NJ)})
    # enable each job: the initializer resets its records, then enable_set
    await enable_jobs(cycle, table, len(jobs), P)
    # traffic
    traffic = generate(jobs, p["n"], p["seed"], Mix(**p.get("mix", {})))
    for dgram, src in traffic:
        beats = datagram_beats(dgram, L)
        t0 = None
        for k, (words, n) in enumerate(beats):
            ent = {"data": sum(w << (32 * i) for i, w in enumerate(words)), "first": int(k == 0),
                   "last": int(k == len(beats) - 1), "length": len(dgram),
                   "src_ip": _ip(src[0]), "src_port": src[1], "ts": 0}
            while True:
                if rng.random() < p.get("idle", 0.3):
                    await cycle()
                    continue
                t = now
                if await cycle(push_beat=ent):
                    t0 = t if t0 is None else t0
                    break
        sb.packet(dgram, src, t0)
        sb.tick(now)
    # drained: past every deadline and the scanner's round, the queue empty
    for k in range(100000):
        await cycle()
        if now % 16 == 0:
            sb.tick(now)
        if k > 2 * p.get("deadline", 300) + 4 * P.records and not queue and sending is None:
            break
    sb.tick(now)
    # the model's results, a header each (a group result once; OVERFLOW cleared)
    keys = check_results(sb, got)
    check_events(sb, traffic, events)
    assert sum(len(v) for v in got.values()) > p["n"] // 2, "too few results"
    dut._log.info(f"{len(traffic)} datagrams, {sum(len(v) for v in got.values())} requests, "
                  f"{len(keys)} slots; events {dict(events)}")
