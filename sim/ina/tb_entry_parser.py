"""Bench of :class:`~ina_fabric.hw.ina.entry.EntryParser`: CONTROL entries (installs,
live updates, removals, and every kind of malformed one: unknown flags, a member count
the length does not say, mode 2, a window that is no power of two, no or too many
elements, no or too long a deadline, session 0, two members at one address) in a buffer
the bench answers through the word reader; the verdict against the protocol's own
``jobtable.parse_control`` (the core takes modes 0 and 1 only), the fields and the
deadline in cycles against the entry."""

import cocotb
import numpy as np

from ina_fabric.hw.ina.entry import entry_layout
from ina_fabric.hw.ina.reader import READ_LATENCY
from ina_fabric.protocol.jobtable import (ConfigError, ENTRY_DTYPE, MEMBER_DTYPE, MAX_ELEMENTS,
                                          parse_control)
from ina_fabric.sim.bench import Bench, bench_params, unpack


def _entry(rng, kind):
    n = rng.randint(1, 6)
    e = np.zeros((), ENTRY_DTYPE)
    e["job"], e["nworkers"], e["mode"] = rng.getrandbits(16), n, rng.randint(0, 1)
    e["window"], e["elements"] = 1 << rng.randint(0, 6), rng.randint(1, 64)
    e["deadline_us"], e["session"] = rng.randint(1, 10 ** 6), rng.getrandbits(64) | 1
    e["flags"] = rng.choice((0, 1))
    if rng.random() < 0.3:
        e["mcast_ip"], e["mcast_port"] = rng.getrandbits(32), rng.getrandbits(16)
    m = np.zeros(n, MEMBER_DTYPE)
    m["ip"] = [rng.getrandbits(32) for _ in range(n)]
    m["port"] = [rng.getrandbits(16) for _ in range(n)]
    m["mac"] = [[rng.getrandbits(8) for _ in range(6)] for _ in range(n)]
    kmem = n
    if kind == "remove":
        e["nworkers"], kmem, m = 0, 0, m[:0]
        if rng.random() < 0.3:
            e["session"] = 0
    elif kind == "bad":
        what = rng.choice(("flags", "count", "mode", "window", "elements", "deadline",
                           "session", "dup", "big_deadline"))
        if what == "flags":
            e["flags"] = rng.getrandbits(16) | 2
        elif what == "count":
            e["nworkers"] = n + rng.choice((-1, 1)) if n > 1 else 2
        elif what == "mode":
            e["mode"] = rng.randint(2, 255)
        elif what == "window":
            e["window"] = rng.choice((0, 3, 6, 100, 65535))
        elif what == "elements":
            e["elements"] = rng.choice((0, MAX_ELEMENTS + 1, 65535))
        elif what == "deadline":
            e["deadline_us"] = 0
        elif what == "big_deadline":
            e["deadline_us"] = rng.randint(4294000000, 4294967295)
        elif what == "session":
            e["session"] = 0
        elif what == "dup" and n > 1:
            k = rng.randrange(1, n)
            m[k]["ip"], m[k]["port"] = m[0]["ip"], m[0]["port"]
    return e.tobytes() + m.tobytes(), kmem


@cocotb.test()
async def test_entry_parser(dut):
    p = bench_params()
    cpu = p["cycles_per_us"]
    b = Bench(dut, seed=p["seed"])
    await b.reset(start=0, kmem=0, rd__word=0)
    for k in range(p["n"]):
        kind = b.rng.choice(("good", "good", "remove", "bad", "bad"))
        payload, kmem = _entry(b.rng, kind)
        dg = bytes(28) + payload
        words = [int.from_bytes(dg[i:i + 4], "big") for i in range(0, len(dg), 4)]
        try:
            op, val = parse_control(payload)
            bad = op != "remove" and val.mode not in ("reliable", "bounded")
        except ConfigError:
            op, bad = None, True
        b.wr("kmem", kmem)
        b.wr("start", 1)
        addrs, addr = [None] * READ_LATENCY, None
        for cyc in range(20000):
            a = addrs[-READ_LATENCY]
            b.wr("rd__word", words[a] if a is not None and a < len(words) else b.rng.getrandbits(32))
            await b.step()
            b.wr("start", 0)
            if b.rd("rd__en"):
                addr = b.rd("rd__addr")
            addrs.append(addr)
            if b.rd("done"):
                break
        else:
            raise AssertionError(f"entry {k}: no verdict")
        mal = b.rd("malformed")
        assert mal == int(bad), f"entry {k} ({kind}): malformed {mal}, parse_control: {op}"
        if not bad:
            assert b.rd("remove") == int(op == "remove"), f"entry {k}: remove"
            e = np.frombuffer(payload, ENTRY_DTYPE, count=1)[0]
            got = b.rd("entry", entry_layout())
            assert got == {n: int(e[n]) for n in ENTRY_DTYPE.names}, f"entry {k}: fields"
            if op != "remove":
                assert b.rd("cyc") == int(e["deadline_us"]) * cpu, f"entry {k}: cycles"
                assert 1 << b.rd("l2w") == int(e["window"]), f"entry {k}: log2 window"
        for _ in range(b.rng.choice((0, 2))):
            await b.step()
