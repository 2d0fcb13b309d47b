"""Bench of :class:`~ina_fabric.hw.ina.entry.EntryWriter`: random parsed entries (installs
that fit or not, into a free entry, over the same job, over another session's job young
or idle, into a full table; live updates that change only the deadline, or more, or a
member, or of a job not installed or another session's; removals by the holding
session, by another, by session 0), with random idle gaps and DATA ``accepted`` pulses
between them, against a small model of the block written from its docstring (the
reference model's rules: ``SwitchModel.add_job``/``update_job``/``remove_job``, and the
core's own refusals).

The bench is the rest of the core: a register table that takes the bus writes
``WRITE_LATENCY`` cycles later (the job initializer sets ``enable`` a random few cycles
after a write of 1), the member table's synchronous read port, and the word reader over
the datagram's members (the word ``READ_LATENCY`` cycles after its address, garbage
otherwise). For each entry it checks the reply, the one ``control`` or
``control_refused`` event, the exact bus writes in order (an install: enable 0, the
registers, each member's four words, enable 1), ``age`` on a "taken" refusal, and the
job and member tables after it."""

import cocotb

from ina_fabric.hw.ina.entry import MEMBERS_AT, WRITER_EVENTS, entry_layout
from ina_fabric.hw.ina.params import CoreParams
from ina_fabric.hw.ina.reader import READ_LATENCY
from ina_fabric.hw.ina.regfile import job_layout
from ina_fabric.hw.ina.status import Reply
from ina_fabric.protocol.regs import (JOB_BASE, JOB_REGS, JOB_STRIDE, MEMBER_BASE,
                                      MEMBER_REGS, WRITE_LATENCY)
from ina_fabric.sim.bench import Bench, bench_params, pack

from amaranth.lib import data

WIDTH = {r.name: r.width for r in JOB_REGS}
JREG = {r.name: r.offset for r in JOB_REGS}
MREG = {r.name: r.offset for r in MEMBER_REGS}
BUS = data.StructLayout({"addr": 16, "w_stb": 1, "w_data": 32})
EVENTS = data.StructLayout(WRITER_EVENTS)
SESSIONS = (0x1122334455667788, 0xFEDCBA9876543210)


def _log2(n):
    return (n - 1).bit_length()


def expected(P, WS, table, members, idle, rec, e, cyc, l2w, remove, kmem, buf_members):
    """The model: (reply, event, bus writes [(addr, data)], age or None)."""
    NJ = P.jobs
    hit = [j for j in range(NJ) if table[j]["enable"] and table[j]["job_id"] == e["job"]]
    free = [j for j in range(NJ) if not table[j]["enable"]]
    found = bool(hit)
    slot = hit[0] if hit else 0
    sess = lambda j: (table[j]["session_hi"] << 32) | table[j]["session_lo"]
    held_other = found and sess(slot) != e["session"]
    age = idle[slot] if found else None

    def job_w(j, name, v):
        return (JOB_BASE + JOB_STRIDE * j + JREG[name], v & 0xFFFFFFFF)
    if remove:
        if held_other and e["session"] != 0:
            return Reply.NOT_REMOVED, "control_refused", [], age
        return Reply.REMOVE, "control", [job_w(j, "enable", 0) for j in hit], age
    if e["flags"] & 1:
        if not found:
            return Reply.NOT_INSTALLED, "control_refused", [], age
        if held_other:
            return Reply.OTHER_SESSION, "control_refused", [], age
        t = table[slot]
        same = (t["nworkers"] == e["nworkers"] and t["bounded"] == e["mode"] & 1
                and t["log2_window"] == l2w and t["elements"] == e["elements"]
                and t["mcast_en"] == int(e["mcast_ip"] != 0)
                and (e["mcast_ip"] == 0 or (t["mcast_ip"] == e["mcast_ip"]
                                            and t["mcast_port"] == e["mcast_port"])))
        same = same and all(members[slot * WS + k if WS > 1 else slot] == buf_members[k]
                            for k in range(kmem))
        if not same:
            return Reply.ONLY_DEADLINE, "control_refused", [], age
        if cyc >= 1 << 31:
            return Reply.NO_FIT, "control_refused", [], age
        return Reply.UPDATE, "control", [job_w(slot, "deadline", cyc)], age
    fits = (e["window"] <= P.window and e["elements"] <= P.elements
            and e["nworkers"] <= P.workers and cyc < 1 << 31)
    if held_other and idle[slot] != rec:
        return Reply.TAKEN, "control_refused", [], age
    if not fits:
        return Reply.NO_FIT, "control_refused", [], age
    if not found and not free:
        return Reply.TABLE_FULL, "control_refused", [], age
    j = slot if found else free[0]
    mc = e["mcast_ip"] != 0
    vals = [("enable", 0), ("job_id", e["job"]), ("nworkers", e["nworkers"]),
            ("bounded", e["mode"] & 1), ("log2_window", l2w), ("elements", e["elements"]),
            ("deadline", cyc), ("mcast_en", int(mc)), ("mcast_ip", e["mcast_ip"]),
            ("mcast_port", e["mcast_port"] if mc else 0),
            ("session_hi", e["session"] >> 32), ("session_lo", e["session"])]
    w = [job_w(j, n, v) for n, v in vals]
    for k in range(kmem):
        ip, port, mac = buf_members[k]
        a = MEMBER_BASE + (j << 7) + (k << 2)
        w += [(a + MREG["ip"], ip), (a + MREG["port"], port), (a + MREG["mac_hi"], mac >> 32),
              (a + MREG["mac_lo"], mac & 0xFFFFFFFF)]
    w.append(job_w(j, "enable", 1))
    return Reply.INSTALL, "control", w, age


def random_entry(rng, P, WS, ids, table, members):
    """A random entry, often one like an installed job's (an update or a removal): (the
    entry, ``cyc``, the members its datagram holds, ``remove``)."""
    NJ = P.jobs
    inst = [j for j in range(NJ) if table[j]["enable"]]
    kind = rng.random()
    nw = rng.randint(1, P.workers + (1 if rng.random() < 0.1 else 0))
    win = 1 << rng.randint(0, _log2(P.window) + (1 if rng.random() < 0.1 else 0))
    e = {"job": rng.choice(ids), "nworkers": nw, "mode": rng.getrandbits(1),
         "window": win, "elements": rng.randint(1, P.elements + (rng.random() < 0.1)),
         "deadline_us": 0, "mcast_ip": rng.choice((0, 0xE0000000 | rng.getrandbits(28))),
         "mcast_port": rng.getrandbits(16), "flags": 0,
         "session": rng.choice(SESSIONS)}
    cyc = rng.getrandbits(20) if rng.random() < 0.9 else (1 << 31) + rng.getrandbits(8)
    bm = [(rng.getrandbits(32), rng.getrandbits(16), rng.getrandbits(48))
          for _ in range(nw)]
    remove = 0
    if inst and kind < 0.5:             # like an installed job: an update or a removal
        j = rng.choice(inst)
        t = table[j]
        e.update(job=t["job_id"], nworkers=t["nworkers"], mode=t["bounded"],
                 window=1 << t["log2_window"], elements=t["elements"],
                 mcast_ip=t["mcast_ip"], mcast_port=t["mcast_port"],
                 session=(t["session_hi"] << 32) | t["session_lo"])
        if rng.random() < 0.2:
            e["session"] = rng.choice(SESSIONS)
        bm = [members[j * WS + k if WS > 1 else j] for k in range(t["nworkers"])]
        if kind < 0.35:
            e["flags"] = 1
            if rng.random() < 0.15:
                e["elements"] = max(1, e["elements"] - 1)
            if bm and rng.random() < 0.15:
                k = rng.randrange(len(bm))
                bm[k] = (bm[k][0] ^ 1 << rng.randrange(32), bm[k][1], bm[k][2])
        else:
            remove = 1
            if rng.random() < 0.2:
                e["session"] = 0
    elif kind < 0.6:
        e["flags"] = 1
    elif kind < 0.65:
        remove = 1
    if remove:
        e["nworkers"], bm = 0, []
    return e, cyc, bm, remove


def fill_members(buf, bm):
    """The datagram's words: the members ``bm`` from ``MEMBERS_AT``."""
    buf.clear()
    for k, (ip, port, mac) in enumerate(bm):
        a = MEMBERS_AT + 3 * k
        buf[a], buf[a + 1], buf[a + 2] = ip, (port << 16) | (mac >> 32), mac & 0xFFFFFFFF


async def until_done(cycle, op):
    """The cycles to ``done``: (the last cycle's outputs, bus writes, events)."""
    writes, events = [], []
    for n in range(20000):
        out = await cycle()
        if out["bus__w_stb"]:
            writes.append((out["bus__addr"], out["bus__w_data"]))
        for ev in ("control", "control_refused"):
            if out[f"events__{ev}"]:
                events.append(ev)
        if out["done"]:
            break
    else:
        raise AssertionError(f"entry {op}: not done after 20000 cycles")
    return out, writes, events


@cocotb.test()
async def test_entry_writer(dut):
    p = bench_params()
    P = CoreParams(**p["core"])
    NJ, REC = P.jobs, p["reclaim"]
    WS = 1 << _log2(P.workers)
    b = Bench(dut, seed=p["seed"])
    rng = b.rng
    JL, EL = job_layout(), entry_layout()
    JS = data.Layout.cast(JL).size
    table = [{r.name: 0 for r in JOB_REGS} for _ in range(NJ)]
    members = [(0, 0, 0)] * (NJ * WS)
    mac_hi = 0
    idle = [REC] * NJ           # the block's idle counters, kept by the bench
    en_prev = [0] * NJ
    pending = []                # bus writes on their way: (cycles left, addr, data)
    init_due = {}               # job: cycles until the initializer sets enable
    addrs = [None] * READ_LATENCY
    raddr = None
    member_data = None
    buf = {}                    # the datagram's words (the members)

    def apply(addr, v):
        nonlocal mac_hi
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
                mac_hi = v & 0xFFFF
            else:
                members[idx] = (ip, port, (mac_hi << 32) | v)
            return
        j, off = divmod(addr - JOB_BASE, JOB_STRIDE)
        name = next(r.name for r in JOB_REGS if r.offset == off)
        if name == "enable":
            table[j]["enable"] = 0
            init_due.pop(j, None)
            if v & 1:
                init_due[j] = rng.randint(2, 12)
        else:
            table[j][name] = v & ((1 << WIDTH[name]) - 1)

    async def cycle(accepted=0):
        """One cycle: drive the table, the reader and the member port; sample; the edge."""
        nonlocal raddr, member_data
        b.wr("jobs", sum(pack(JL, table[j]) << (JS * j) for j in range(NJ)))
        b.wr("accepted", accepted)
        a = addrs[-READ_LATENCY]
        b.wr("rd__word", buf.get(a, rng.getrandbits(32)) if a is not None
             else rng.getrandbits(32))
        if member_data is not None:
            ip, port, mac = member_data
            b.wr("member__data", ip | (port << 32) | (mac << 48))
        await b.step()
        out = {k: b.rd(k) for k in ("done", "reply", "age", "rd__en", "rd__addr",
                                    "member__en", "member__addr")}
        out.update({f"bus__{k}": v for k, v in b.rd("bus", BUS).items()})
        out.update({f"events__{k}": v for k, v in b.rd("events", EVENTS).items()})
        # the edge, as the rest of the core sees it
        if out["rd__en"]:
            raddr = out["rd__addr"]
        addrs.append(raddr)
        if out["member__en"]:
            member_data = members[out["member__addr"]]
        for j in range(NJ):
            rise = table[j]["enable"] and not en_prev[j]
            en_prev[j] = table[j]["enable"]
            if accepted >> j & 1 or rise:
                idle[j] = 0
            elif idle[j] != REC:
                idle[j] += 1
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
        if out["bus__w_stb"]:
            pending.append([WRITE_LATENCY, out["bus__addr"], out["bus__w_data"]])
        return out

    await b.reset(start=0, entry=0, cyc=0, l2w=0, remove=0, kmem=0, jobs=0, accepted=0,
                  member__data=0, rd__word=0)
    ids = [rng.getrandbits(16) for _ in range(NJ + 1)]
    seen = {}
    for op in range(p["n"]):
        # a gap: DATA accepted now and then
        for _ in range(rng.choice((0, 1, 3, REC // 2, REC + 5))):
            await cycle(accepted=(1 << rng.randrange(NJ)) if rng.random() < p["accept"] else 0)
        # an entry: often one like an installed job's, so updates and removals meet it
        e, cyc, bm, remove = random_entry(rng, P, WS, ids, table, members)
        kmem = len(bm)
        l2w = e["window"].bit_length() - 1
        fill_members(buf, bm)
        while pending or init_due:          # (the table is settled when an entry starts)
            await cycle()
        b.wr("entry", pack(EL, e))
        b.wr("cyc", cyc)
        b.wr("l2w", l2w)
        b.wr("remove", remove)
        b.wr("kmem", kmem)
        b.wr("start", 1)
        # the model decides with the idle counters of the DECIDE cycle (two edges on)
        await cycle()
        b.wr("start", 0)
        idle_lookup = list(idle)            # (LOOKUP registers the found job's age)
        out = await cycle()
        want = expected(P, WS, table, members, idle, REC, e, cyc, l2w, remove, kmem, bm)
        if want[3] is not None:
            want = (*want[:3], idle_lookup[table.index(next(
                t for t in table if t["enable"] and t["job_id"] == e["job"]))])
        out, writes, events = await until_done(cycle, op)
        reply, event, bus, age = want
        what = f"entry {op} ({e}, remove {remove}, cyc {cyc:#x})"
        assert out["reply"] == reply.value, f"{what}: reply {Reply(out['reply'])}, want {reply}"
        assert events == [event], f"{what}: events {events}, want {event}"
        assert writes == bus, f"{what}: bus writes {writes}, want {bus}"
        if reply == Reply.TAKEN:
            assert out["age"] == age, f"{what}: age {out['age']}, want {age}"
        seen[reply] = seen.get(reply, 0) + 1
    while pending or init_due:
        await cycle()
    dut._log.info(f"replies: { {k.name: v for k, v in seen.items()} }")
    need = {Reply.INSTALL, Reply.REMOVE, Reply.UPDATE, Reply.NOT_INSTALLED}
    assert p["n"] < 100 or need <= set(seen), f"replies seen: {seen}"
