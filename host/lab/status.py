"""``ina lab status``: per-link throughput, queue drops and backlog from the tbf counters
at both ends of every link, and the RTT distribution from each host to its switch,
measured by a UDP probe (bounded: ``probes`` datagrams, 5 ms apart)."""

import os
import time

from . import netns as N
from . import probe as P

__all__ = ["status", "link_counters"]


def wan_counters(lab) -> dict:
    """(a, b) -> {"ab": a's egress towards b, "ba": b's egress towards a}."""
    out = {}
    for w in lab.topo.wan:
        with N.ipr(lab.ns(w.a)) as ip:
            ab = N.qdisc_stats(ip, f"w{w.b}")
        with N.ipr(lab.ns(w.b)) as ip:
            ba = N.qdisc_stats(ip, f"w{w.a}")
        out[(w.a, w.b)] = {"ab": ab, "ba": ba}
    return out


def link_counters(lab) -> dict:
    """host -> {"up": host eth0 egress counters, "down": switch port egress counters}."""
    out = {}
    for h in lab.topo.hosts:
        with N.ipr(lab.ns(h.name)) as ip:
            up = N.qdisc_stats(ip, "eth0")
        with N.ipr(lab.ns(h.switch)) as ip:
            down = N.qdisc_stats(ip, h.name)
        out[h.name] = {"up": up, "down": down}
    return out


def _alive(pid) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def status(lab, seconds=1.0, probes=20) -> dict:
    a, wa = link_counters(lab), wan_counters(lab)
    t0 = time.monotonic()
    rtts = {}
    if probes:
        for h in lab.topo.hosts:
            r = P.rtt(lab, h.name, h.switch, count=probes, interval_ms=5.0, port=5009)
            r.pop("samples_ms", None)
            rtts[h.name] = r
    time.sleep(max(0.0, seconds - (time.monotonic() - t0)))
    dt = time.monotonic() - t0
    b, wb = link_counters(lab), wan_counters(lab)
    wan = []
    for w in lab.topo.wan:
        k = (w.a, w.b)
        wan.append({"a": w.a, "b": w.b, "rate": w.link.rate, "delay_ms": w.link.delay_ms,
                    "ab": wb[k]["ab"], "ba": wb[k]["ba"],
                    "ab_mbit_s": (wb[k]["ab"]["bytes"] - wa[k]["ab"]["bytes"]) * 8 / dt / 1e6,
                    "ba_mbit_s": (wb[k]["ba"]["bytes"] - wa[k]["ba"]["bytes"]) * 8 / dt / 1e6})
    links = []
    for h in lab.topo.hosts:
        row = {"host": h.name, "switch": h.switch, "rate": h.link.rate,
               "up": b[h.name]["up"], "down": b[h.name]["down"],
               "up_mbit_s": (b[h.name]["up"]["bytes"] - a[h.name]["up"]["bytes"]) * 8 / dt / 1e6,
               "down_mbit_s": (b[h.name]["down"]["bytes"] - a[h.name]["down"]["bytes"])
               * 8 / dt / 1e6}
        if h.name in rtts:
            row["rtt_ms"] = rtts[h.name]["rtt_ms"]
            row["rtt_lost"] = rtts[h.name]["lost"]
        links.append(row)
    services = {name: {**s, "alive": _alive(s["pid"])} for name, s in lab.services.items()}
    return {"lab": lab.id, "topology": lab.topo.name, "seconds": dt, "links": links,
            "wan": wan, "services": services}
