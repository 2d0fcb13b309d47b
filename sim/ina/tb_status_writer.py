"""Bench of :class:`~ina_fabric.hw.ina.status.StatusWriter`: every reply kind (the
control answers and STATUS pages over random job tables and counters), each with a
random job id, age and nonce, and the reply sealed and sent under output backpressure.

The bench is the rest of the control plane: it reads the rendered reply through the
buffer's read port and checks it against the reference model's text
(``SwitchModel._status_bytes`` of the dict ``SwitchModel._control`` / ``add_job`` /
``update_job`` / ``remove_job`` / ``status_datagram`` would answer, from their messages;
the STATUS page compared as JSON, since the core lists jobs in table order, and the
job entries hold the keys the core has), plus the nonce; it then hands in the HMAC of it
(``hmac``/``hashlib``) as the digest, answers the word reader from the buffer as the
control plane does (the registered address, the block RAM, the registered word), and
unseals the datagram that comes out (``protocol.auth.unseal``): its beats laid out as
the core's output, the L2/L3 sideband (``ipv4_header``'s checksum), ``sent`` once.

(The seconds of a "taken" reply are the core's round-half-up of cycles / clock; the
model's ``.0f`` rounds half to even: the bench draws no age at exactly half a second.)
"""

import hashlib
import hmac
import json

import cocotb
from amaranth.lib import data

from host.switch.model import SwitchModel
from ina_fabric.hw.ina.layout import out_layout
from ina_fabric.hw.ina.params import CoreParams
from ina_fabric.hw.ina.regfile import job_layout
from ina_fabric.hw.ina.replicator import ipv4_header
from ina_fabric.hw.ina.status import Reply
from ina_fabric.protocol.auth import unseal
from ina_fabric.protocol.regs import COUNTER_NAMES
from ina_fabric.sim.bench import Bench, bench_params, pack
from ina_fabric.sim.ina.beats import datagram_beats

KEY = bytes(range(32))


def model_doc(P, kind, job, age_s, table, counters):
    """The dict the reference model answers with."""
    j = job
    texts = {
        Reply.NOT_INSTALLED: f"job {j}: live update of a job that is not installed",
        Reply.ONLY_DEADLINE: f"job {j}: a live update may change only the deadline; "
                             f"install the job anew to change anything else",
        Reply.TAKEN: f"job {j} is taken by another run (active {age_s:.0f} s ago); "
                     f"remove it first or use another job id",
        Reply.OTHER_SESSION: f"job {j}: live update from another session",
        Reply.NOT_REMOVED: f"job {j}: held by another session; not removed",
        # the core's own refusals (a job it cannot hold)
        Reply.TABLE_FULL: f"job {j}: the switch holds {P.jobs} jobs, its limit",
        Reply.NO_FIT: f"job {j}: does not fit the core (window <= {P.window}, elements <= "
                      f"{P.elements}, workers <= {P.workers}, deadline below 2^31 cycles)",
    }
    if kind in texts:
        return {"error": texts[kind]}
    if kind in (Reply.INSTALL, Reply.UPDATE, Reply.REMOVE):
        return {"ok": True, "op": kind.name.lower(), "job": j}
    jobs = {}
    for t in table:
        if t["enable"]:
            jobs[str(t["job_id"])] = {
                "workers": t["nworkers"], "window": 1 << t["log2_window"],
                "elements": t["elements"], "mode": "bounded" if t["bounded"] else "reliable",
                "session": f"{(t['session_hi'] << 32) | t['session_lo']:016x}"}
    return {"counters": dict(zip(COUNTER_NAMES, counters)), "jobs": jobs, "next_job": None}


@cocotb.test()
async def test_status_writer(dut):
    p = bench_params()
    P = CoreParams(**p["core"])
    NJ, L, HZ = P.jobs, P.lanes, p["clock_hz"]
    b = Bench(dut, seed=p["seed"])
    rng = b.rng
    JL = job_layout()
    JS = data.Layout.cast(JL).size
    snk = b.sink("o", out_layout(L), backpressure=p.get("bp", 0.3))
    DST = data.StructLayout({"ip": 32, "port": 16, "mac": 48})
    await b.reset(start=0, kind=0, job=0, age=0, nonce=0, jobs=0, counters=0, buf_addr=0,
                  seal=0, digest=0, rd__word=0, src_ip=0, dst=0)
    kinds = list(Reply)
    seen = {}
    for op in range(p["n"]):
        kind = kinds[op % len(kinds)] if op < len(kinds) else rng.choice(kinds)
        job = rng.choice((0, 7, 65535, rng.getrandbits(16)))
        age = rng.randrange(p["reclaim"] + 1)
        if age % HZ == HZ // 2 and HZ % 2 == 0:
            age += 1
        nonce = rng.getrandbits(64)
        ids = rng.sample(range(1 << 16), NJ)
        table = [{"job_id": ids[j], "nworkers": rng.randint(1, P.workers),
                  "bounded": rng.getrandbits(1), "log2_window": rng.randint(0, 3),
                  "elements": rng.randint(1, P.elements), "deadline": rng.getrandbits(31),
                  "mcast_en": 0, "mcast_ip": 0, "mcast_port": 0,
                  "enable": int(rng.random() < 0.6), "session_hi": rng.getrandbits(32),
                  "session_lo": rng.getrandbits(32)} for j in range(NJ)]
        counters = [rng.choice((0, 1, 9, 10, 4294967295, rng.getrandbits(32)))
                    for _ in COUNTER_NAMES]
        src_ip, dst = rng.getrandbits(32), {"ip": rng.getrandbits(32),
                                            "port": rng.getrandbits(16),
                                            "mac": rng.getrandbits(48)}
        b.wr("jobs", sum(pack(JL, table[j]) << (JS * j) for j in range(NJ)))
        b.wr("counters", sum(c << (32 * k) for k, c in enumerate(counters)))
        b.wr("src_ip", src_ip)
        b.wr("dst", dst, DST)
        b.wr("job", job)
        b.wr("age", age)
        b.wr("nonce", nonce)
        b.wr("kind", kind.value)
        b.wr("start", 1)
        await b.step()
        b.wr("start", 0)
        for cyc in range(100000):
            await b.step()
            if b.rd("rendered"):
                break
        else:
            raise AssertionError(f"reply {op} ({kind}): not rendered")
        length = b.rd("length")
        # the rendered reply, read through the buffer's port
        words = []
        for w in range((length + 3) // 4 + 1):
            b.wr("buf_addr", min(w, 511))
            await b.step()
            if w:
                words.append(b.rd("buf_data"))
        body = b"".join(x.to_bytes(4, "big") for x in words)[:length]
        doc = model_doc(P, kind, job, age / HZ, table, counters)
        want = SwitchModel._status_bytes(doc) + nonce.to_bytes(8, "big")
        what = f"reply {op} ({kind.name}, job {job})"
        if kind == Reply.STATUS:
            assert body[:28] == want[:28] and body[-8:] == want[-8:], f"{what}: {body!r}"
            assert json.loads(body[28:-8]) == doc, f"{what}: {body[28:-8]!r} != {doc}"
        else:
            assert body == want, f"{what}: {body!r} != {want!r}"
        # the seal: the HMAC of the reply, as the HMAC engine gives it
        tag = hmac.new(KEY, body, hashlib.sha256).digest()
        b.wr("digest", sum(int.from_bytes(tag[4 * k:4 * k + 4], "big") << (32 * k)
                           for k in range(8)))
        for _ in range(rng.choice((0, 1, 5))):
            await b.step()
        b.wr("seal", 1)
        await b.step()
        b.wr("seal", 0)
        # sent: the word reader answered from the buffer, as the control plane does
        widx, word, start, sent = 0, 0, len(snk.got), 0
        for cyc in range(100000):
            b.wr("buf_addr", widx)
            b.wr("rd__word", word)
            await b.step()
            word = b.rd("buf_data")
            if b.rd("rd__en"):
                widx = b.rd("rd__addr")
            sent += b.rd("sent")
            if sent:
                break
        else:
            raise AssertionError(f"{what}: not sent")
        for _ in range(3):
            await b.step()
            sent += b.rd("sent")
        assert sent == 1, f"{what}: sent {sent} times"
        beats = snk.got[start:]
        dgram = b"".join(((g["data"] >> (32 * k)) & 0xFFFFFFFF).to_bytes(4, "big")
                         for g in beats for k in range(g["n"]))
        final = body + tag[:16]
        assert dgram[:len(final)] == final and len(dgram) == (len(final) + 3) // 4 * 4, \
            f"{what}: sent {dgram!r}, want {final!r}"
        assert unseal(dgram[:len(final)], KEY)[1] == nonce
        lay = datagram_beats(final, L)
        assert [(g["n"], g["first"], g["last"]) for g in beats] == \
            [(n, int(k == 0), int(k == len(lay) - 1)) for k, (_, n) in enumerate(lay)], \
            f"{what}: beats"
        ck = int.from_bytes(ipv4_header(src_ip, dst["ip"], len(final))[10:12], "big")
        for g in beats:
            assert (g["length"], g["dst_ip"], g["dst_port"], g["dst_mac"], g["mcast"],
                    g["ip_checksum"]) == (len(final), dst["ip"], dst["port"], dst["mac"], 0,
                                          ck), f"{what}: sideband {g}"
        seen[kind.name] = seen.get(kind.name, 0) + 1
    dut._log.info(f"replies: {seen}")
