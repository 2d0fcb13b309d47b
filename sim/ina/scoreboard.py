"""Scoreboard: the reference model (host/switch/model.py) replayed on what the
core saw, compared with what the core sent.

Time. The core's time is its cycle counter; a packet's time is the cycle its first beat
was accepted (the bench reads the ``now`` port then). The model runs in the same unit:
``now`` = cycles, and each job's ``deadline`` = its deadline in cycles.

Order. Outputs are compared per slot (job, seq): the same datagrams, to the same
destinations, in the same order. Across slots the core may interleave differently
(its deadline scanner fires slots a few cycles after the model's ``tick`` would).
ERRORs (the answers to refused DATA, issue 43) are compared as one list, in order: the
core decides packets in arrival order, and its answer path keeps that order (it is not
ordered against RESULTs, which leave through the replicator). An ERROR goes to the
DATA's source: its ``dst_mac`` is the frame's source MAC (``beats.source_mac``).
STATUS replies (and the model's sealed replies to CONTROL) are not compared: the core
counts STATUS_REQ and CONTROL but answers through its counter registers.

Control. ``key`` gives the model the core's control key; ``time_scale`` converts cycles
to the model's seconds (a CONTROL entry's deadline is in microseconds: a core built with
``cycles_per_us=1`` runs against ``time_scale=1e-6``); ``max_jobs`` is the core's
job-table size, so both refuse the same install; ``error_interval`` the core's (in
cycles, ``InaCore.error_interval``): the model answers a source bucket as often.
"""

from collections import defaultdict
import ipaddress

import numpy as np

from ina_fabric.host.switch.model import SwitchModel
from ina_fabric.protocol.jobtable import GATEWARE_MODES
from ina_fabric.protocol.fields import MsgType, HEADER_BYTES
from ina_fabric.protocol.numpy_view import HEADER_DTYPE
from ina_fabric.hw.ina.replicator import ipv4_header
from ina_fabric.hw.ina.regs import COUNTER_NAMES
from .beats import source_mac

__all__ = ["Scoreboard", "ScoreboardError"]


class ScoreboardError(AssertionError):
    pass


#: the key all ERRORs are compared under (in order)
ERRORS = ("error", 0)


def _key(dgram):
    if dgram[1] == MsgType.ERROR:
        return ERRORS
    h = np.frombuffer(dgram, HEADER_DTYPE, count=1)[0]
    return int(h["job"]), int(h["seq"])


class Scoreboard:
    def __init__(self, jobs, src_ip="10.0.0.254", *, key=None, time_scale=1.0,
                 max_jobs=None, error_interval=None, widths=None, parent=None,
                 parent_mac=None):
        # the gateware runs GATEWARE_MODES: the model drops other modes' CONTROL as it does
        # (the bench's core: INA_ERR_CYCLES, set by the test that built it; else the
        # core's default at cycles_per_us=1); ``widths``: the element widths the core was
        # built with (``CoreParams.widths``), so the model drops the others as malformed
        # as the core does
        from ina_fabric.hw.ina.answer import interval_cycles
        import os
        cycles = (int(os.environ.get("INA_ERR_CYCLES", interval_cycles(1)))
                  if error_interval is None else error_interval)
        self.model = SwitchModel(jobs, key=key, modes=GATEWARE_MODES,
                                 error_interval=cycles * time_scale,
                                 **({"max_jobs": max_jobs} if max_jobs else {}),
                                 **({"widths": tuple(widths)} if widths else {}))
        self.time_scale = time_scale
        #: the model's STATUS replies (to CONTROL) are compared with the core's, in order
        self.compare_replies = key is not None
        self.jobs = {j.job: j for j in jobs}
        #: a leaf core's parent switch ``(ip, port)`` and its MAC (its partial sums go there)
        self.parent = None if parent is None else tuple(parent)
        self.parent_mac = parent_mac
        self.src_ip = int(ipaddress.IPv4Address(src_ip))
        self.expected = defaultdict(list)
        self.got = defaultdict(list)
        self.n_in = self.n_out = 0
        self.history = defaultdict(list)

    def preload_tags(self, job: int, tags: dict):
        """The model's side of ``CoreTB.preload_tags``: records ({(set, index): seq}) of
        job id ``job`` hold ``seq``, complete, with no stored result (so the traffic must
        not ask for a re-send of that seq)."""
        js = self.model.jobs[job]
        for (st, idx), tag in tags.items():
            slot = js.slots[st][idx]
            slot.tag, slot.complete, slot.result = tag & 0xFFFFFFFF, True, None

    def packet(self, dgram, source, now):
        self.n_in += 1
        if len(dgram) >= HEADER_BYTES:
            h = np.frombuffer(dgram, HEADER_DTYPE, count=1)[0]
            self.history[(int(h["job"]), int(h["seq"]))].append(
                (now, int(h["worker"]), int(h["type"]), len(dgram), source))
        for dest, out in self.model.process(dgram, tuple(source), now * self.time_scale):
            self._expect(dest, out)

    def tick(self, now):
        for dest, out in self.model.tick(now * self.time_scale):
            self._expect(dest, out)

    def _expect(self, dest, out):
        if len(out) >= 2 and out[1] == MsgType.STATUS:
            if self.compare_replies:
                self.expected[("reply", 0)].append((tuple(dest), out))
            return
        self.expected[_key(out)].append((tuple(dest), out))

    def output(self, dgram, side):
        """One datagram from the core with its sideband (dict of out_layout fields)."""
        self.n_out += 1
        dst = (str(ipaddress.IPv4Address(side["dst_ip"])), side["dst_port"])
        if side["length"] != len(dgram):
            raise ScoreboardError(f"length {side['length']} != {len(dgram)} bytes")
        want = ipv4_header(self.src_ip, side["dst_ip"], len(dgram))
        if side["ip_checksum"] != int.from_bytes(want[10:12], "big"):
            raise ScoreboardError(f"IPv4 checksum {side['ip_checksum']:#06x} wrong")
        if len(dgram) >= 2 and dgram[1] == MsgType.STATUS:
            self.got[("reply", 0)].append((dst, dgram))
            return
        job = None
        if len(dgram) >= 2 and dgram[1] == MsgType.ERROR:
            if side["mcast"] or side["dst_mac"] != source_mac(dst):
                raise ScoreboardError(f"ERROR to {dst}: dst MAC {side['dst_mac']:012x}, "
                                      f"mcast {side['mcast']} (not the DATA's source)")
            self.got[ERRORS].append((dst, dgram))
            return
        if len(dgram) >= HEADER_BYTES:    # (a job installed by CONTROL is the model's)
            js = self.model.jobs.get(_key(dgram)[0])
            job = js.cfg if js is not None else self.jobs.get(_key(dgram)[0])
        if job is not None:
            if side["mcast"]:
                ip = side["dst_ip"]
                mac = 0x01005E000000 | (ip & 0x7FFFFF)
            elif self.parent is not None and dst == self.parent:
                mac = int(self.parent_mac.replace(":", ""), 16)
            else:
                mem = next((m for m in job.members if m.addr == dst), None)
                if mem is None:
                    raise ScoreboardError(f"output to {dst}, not a member of job {job.job}")
                mac = int(mem.mac.replace(":", ""), 16)
            if side["dst_mac"] != mac:
                raise ScoreboardError(f"dst MAC {side['dst_mac']:012x} != {mac:012x}")
        self.got[_key(dgram) if len(dgram) >= HEADER_BYTES else (-1, -1)].append((dst, dgram))

    def check(self):
        """Raise on the first slot whose outputs differ; return a summary."""
        keys = sorted(set(self.expected) | set(self.got), key=str)
        bad = [k for k in keys if not self._same(k, self.expected.get(k, []),
                                                 self.got.get(k, []))]
        for k in bad[:1]:
            e, g = self.expected.get(k, []), self.got.get(k, [])
            if e != g:
                at = next((i for i, (x, y) in enumerate(zip(e, g)) if x != y),
                          min(len(e), len(g)))
                e, g = e[at:], g[at:]
                raise ScoreboardError(
                    f"(from datagram {at} of the slot on)\n"
                    f"{len(bad)} of {len(keys)} slots differ, first {bad[:8]}\n"
                    f"slot job={k[0]} seq={k[1]}: expected {len(e)} datagrams, got {len(g)}\n"
                    f"  expected: {[(d, o.hex()) for d, o in e][:4]}\n"
                    f"  got:      {[(d, o.hex()) for d, o in g][:4]}\n"
                    f"  inputs (time, worker, type, bytes, source): {self.history.get(k)}")
        return {"in": self.n_in, "out": self.n_out, "slots": len(keys)}

    def _same(self, key, want, got):
        """Equal outputs; for the replies, a STATUS page may differ from the model's in
        what the core does not keep (see ``status_page_matches``)."""
        if key != ("reply", 0) or len(want) != len(got):
            return want == got
        for (wd, wb), (gd, gb) in zip(want, got):
            if (wd, wb) != (gd, gb):
                print(f"reply differs: model {wd} {wb[HEADER_BYTES:]!r}\n  core {gd} {gb[HEADER_BYTES:]!r}")
        return all((wd, wb) == (gd, gb) or (wd == gd and self.status_page_matches(wb, gb))
                   for (wd, wb), (gd, gb) in zip(want, got))

    def status_page_matches(self, want: bytes, got: bytes) -> bool:
        """The core's STATUS page against the model's: sealed with the same key and the
        same nonce; every counter of the model's that the gateware keeps, present and
        equal; the same jobs with the same
        elements, mode, window and workers (the core keeps no deadline in milliseconds,
        open slots or waiting_for); no next page."""
        import json
        from ina_fabric.protocol.auth import unseal
        w, g = unseal(want, self.model.key), unseal(got, self.model.key)
        if g is None or w[1] != g[1]:
            return False
        try:
            wj, gj = json.loads(w[0][HEADER_BYTES:]), json.loads(g[0][HEADER_BYTES:])
        except ValueError:
            return False
        if "counters" not in wj or gj.get("next_job", 0) is not None:
            return False
        # the model's counters that the gateware keeps (protocol/counters.py): a
        # model-only one (the tree's, bounded-skip's) is not on the core's page
        from ina_fabric.protocol.counters import GATEWARE_COUNTERS
        kept = set(wj["counters"]) & set(GATEWARE_COUNTERS)
        common = kept & set(gj["counters"])
        if len(common) < len(kept) or any(
                wj["counters"][n] != gj["counters"][n] for n in common):
            return False
        keys = ("elements", "mode", "session", "window", "workers")
        return {j: {k: v[k] for k in keys} for j, v in wj["jobs"].items()} == gj["jobs"]

    def check_counters(self, hw: dict):
        c = self.model.counters
        bad = {n: (hw[n], c[n]) for n in COUNTER_NAMES if n in c and hw[n] != c[n]}
        if hw.get("stream_errors", 0):
            bad["stream_errors"] = (hw["stream_errors"], 0)
        if bad:
            raise ScoreboardError(f"counters differ (hw, model): {bad}")
