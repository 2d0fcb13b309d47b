"""From a lab and a memory setting to an exported schedule, and from an exported schedule
to what each island does: pure functions, no sockets, no lab.

The schedule optimizer sees the lab as it is built: the islands of ``wan9`` (the
optimizer's own default topology), each island's access rate = the slower of its host
link and its WAN links, the one-way latencies x ``delay_scale`` (1: geographic), and an
update of ``update_bytes`` payload bytes carried in packets of ``elements`` int32. Rates
are payload bytes/s: a packet of E elements takes ``E*4 + HEADER_BYTES + 42`` bytes of
wire (UDP 8, IPv4 20, Ethernet 14), and tbf counts those.

Edge memory. The edge aggregator of an island holds ``M`` bytes of slot memory as the
FPGA would: two sets of W slots of E int32 (``2 * W * E * 4 <= M``, W a power of two).
A sender may then run up to 2W packets ahead of the slowest stream of a slot before the
aggregator drops it (out of window); the optimizer is given ``slot_window = W*E*4`` and
``M``, so the rate it allows (``(M - W*E*4) / (skew + jitter)``) keeps within the W slots
of one set: conservative by a factor of about two.

Addresses in the lab (island k, subnet 198.18.k.0/24):

* ``198.18.k.1:47000``   the island's host: sends its update, receives its aggregate;
* ``198.18.k.254:47001`` the edge replicator (the island's endpoint in schedule.json):
  takes the host's update once and makes the copies for the other islands;
* ``198.18.k.254:19900`` the edge aggregator (``ina switch``): sums what arrives from
  the other islands' replicators and sends the sum to its own host.
"""

from dataclasses import dataclass
import dataclasses

import numpy as np

from ina_fabric.protocol.fields import HEADER_BYTES

__all__ = ["WIRE_OVERHEAD", "HOST_PORT", "REPLICATOR_PORT", "EDGE_PORT", "LabNet",
           "payload_fraction", "edge_window", "schedule_topology", "net_config",
           "candidates", "pick", "export", "RoundPlan", "island_plan",
           "replicator_table", "schedule_label", "at_line_rate"]

#: bytes of wire per datagram beyond the INA header and elements: UDP, IPv4, Ethernet
WIRE_OVERHEAD = 8 + 20 + 14
HOST_PORT, REPLICATOR_PORT, EDGE_PORT = 47000, 47001, 19900


def payload_fraction(elements: int) -> float:
    """Payload bytes / wire bytes of one full DATA datagram."""
    return elements * 4 / (elements * 4 + HEADER_BYTES + WIRE_OVERHEAD)


def edge_window(memory_bytes: float, elements: int) -> int:
    """W for an edge aggregator of ``memory_bytes``: the largest power of two with
    ``2 * W * E * 4 <= M`` (at least 1)."""
    w = 1
    while 2 * (2 * w) * elements * 4 <= memory_bytes:
        w *= 2
    return w


@dataclass(frozen=True)
class LabNet:
    """The lab as the optimizer sees it."""
    islands: int                 # island k: switch i<k>, subnet 198.18.k.0/24
    rate_bits: int               # host link rate (bit/s)
    wan_rate_bits: int           # inter-island link rate (bit/s)
    delay_scale: float = 1.0     # x geographic one-way latency
    elements: int = 256          # int32 per packet
    prefix: str = "198.18"       # island k's subnet: <prefix>.k.0/24 ("127.0" on loopback)

    @classmethod
    def from_lab(cls, topo, elements=256):
        """From a built lab's ``Topology`` (``host.lab``): its params and switches."""
        p = topo.params
        from ina_fabric.host.lab.topology import parse_rate
        return cls(len(topo.switches), parse_rate(p["rate"]), parse_rate(p["wan_rate"]),
                   float(p["delay_scale"]), elements)

    def host(self, k) -> str:
        return f"{self.prefix}.{k}.1:{HOST_PORT}"

    def replicator(self, k) -> str:
        return f"{self.prefix}.{k}.254:{REPLICATOR_PORT}"

    def edge(self, k) -> str:
        return f"{self.prefix}.{k}.254:{EDGE_PORT}"


def schedule_topology(lab: LabNet, source_topology=None):
    """The optimizer's Topology for the lab: same islands and geography, latencies x
    ``delay_scale``, access bandwidth and backbone capacity = the lab's payload rates,
    each island's address = its edge replicator."""
    from ina_fabric.host.schedule.topology import default_topology
    t = source_topology or default_topology()
    if t.n != lab.islands:
        raise ValueError(f"the lab has {lab.islands} islands, the topology {t.n}")
    frac = payload_fraction(lab.elements)
    access = min(lab.rate_bits, lab.wan_rate_bits) / 8 * frac
    t2 = dataclasses.replace(t, bandwidth=np.full(t.n, access),
                             links={k: lab.wan_rate_bits / 8 * frac for k in t.links},
                             addresses=[lab.replicator(k) for k in range(t.n)],
                             source=f"{t.source} (lab: {lab.rate_bits / 1e6:g} Mbit/s hosts, "
                                    f"{lab.wan_rate_bits / 1e6:g} Mbit/s WAN, delays x "
                                    f"{lab.delay_scale:g})")
    t2.latency = t2.latency * lab.delay_scale
    t2.hop_latency = t2.hop_latency * lab.delay_scale
    return t2


def net_config(lab: LabNet, update_bytes: float, memory_bytes: float, jitter_s: float,
               sigma_floor: float = 1e-3):
    from ina_fabric.host.schedule.model import NetConfig
    w = edge_window(memory_bytes, lab.elements)
    return NetConfig(update_bytes=float(update_bytes), memory_bytes=float(memory_bytes),
                     slot_window_bytes=float(w * lab.elements * 4), jitter_s=jitter_s,
                     sigma_floor=sigma_floor)


def schedule_label(cand) -> str:
    return f"cliques-{cand.k}" if cand.family == "cliques" else cand.family


def candidates(topo, net, time_budget_s=30.0, seed=0):
    """``(best label, {label: Candidate}, RoundModel)``: the optimizer's best schedule
    and the best of every family it compares (all-to-all, ring-gossip, static-pairs,
    one-peer-exp, cliques-2 .. cliques-(n-1))."""
    from ina_fabric.host.schedule.model import RoundModel
    from ina_fabric.host.schedule.search import optimize
    model = RoundModel(topo, net)
    res = optimize(topo, net, seed=seed, time_budget_s=time_budget_s, model=model)
    return schedule_label(res.best), {schedule_label(c): c for c in res.candidates}, model


def pick(cands: dict, label: str):
    if label not in cands:
        raise ValueError(f"no schedule {label!r}; have {', '.join(sorted(cands))}")
    return cands[label]


def export(lab: LabNet, topo, net, cand, model, note="", job_base=0) -> dict:
    """schedule.json for the lab: the optimizer's export, with each island's host (where
    its edge sends the aggregate) and edge aggregator, and each edge job's window from M.
    ``job_base`` is added to every job id (runs one after another never share an id)."""
    from ina_fabric.host.schedule.export import schedule_json
    doc = schedule_json(topo, net, cand, model, window=edge_window(net.memory_bytes,
                                                                     lab.elements),
                        elements=lab.elements, note=note,
                        result_to=[lab.host(k) for k in range(lab.islands)])
    for k, isl in enumerate(doc["islands"]):
        isl["host"], isl["edge"] = lab.host(k), lab.edge(k)
    for rnd in doc["rounds"]:
        for g in rnd["groups"]:
            g["job"] += job_base
            for e in g["edge_jobs"]:
                e["id"] += job_base
    doc["label"] = schedule_label(cand)
    # the run's session id: every edge job of this run is installed with it and every
    # DATA and RESULT carries it (one multicast DATA reaches several edges unchanged)
    from ina_fabric.protocol.jobtable import new_session
    doc["session"] = new_session()
    return doc


def at_line_rate(doc: dict, rate: float) -> dict:
    """A control, not a schedule: ``doc`` with every sender at ``rate`` (payload bytes/s,
    the line rate) from offset 0, whatever the edge memory holds."""
    import copy
    out = copy.deepcopy(doc)
    for rnd in out["rounds"]:
        for g in rnd["groups"]:
            g["rate_gbps"] = rate * 8 / 1e9
            for s in g["send"]:
                s["offset_ms"] = 0.0
    out["note"] = f"control: line rate {rate:.0f} B/s from offset 0, memory ignored"
    return out


def _addr(text):
    ip, _, port = text.rpartition(":")
    return ip, int(port)


@dataclass(frozen=True)
class RoundPlan:
    """What one island does in one round of the cycle."""
    round: int
    predicted_s: float          # the round's predicted time (slowest group)
    group_predicted_s: float    # this island's group's predicted time
    send_job: int | None        # the job its update goes out under (None: it sends none)
    offset_s: float             # start of its send after the round's start
    rate: float                 # payload bytes/s of its group
    inbound: tuple[str, ...]    # islands whose update it averages in
    edge_job: object | None     # its edge aggregator's JobConfig (None: nothing inbound)


def island_plan(doc: dict, island: str, deadline_s: float) -> list[RoundPlan]:
    """The rounds of the cycle as island ``island`` runs them; edge jobs in bounded mode
    with ``deadline_s`` (a slot that misses a stream closes PARTIAL, never stalls)."""
    from ina_fabric.protocol.jobtable import JobConfig
    out = []
    for rnd in doc["rounds"]:
        send_job = offset = None
        rate, gpred, inbound, edge = 0.0, 0.0, (), None
        for g in rnd["groups"]:
            if island not in g["members"]:
                continue
            gpred, rate = g["predicted_s"], g["rate_gbps"] * 1e9 / 8
            for s in g["send"]:
                if s["island"] == island:
                    send_job, offset = g["job"], s["offset_ms"] / 1e3
            for e in g["edge_jobs"]:
                if e["island"] == island:
                    inbound = tuple(s["island"] for s in g["send"] if island in s["to"])
                    edge = JobConfig(e["id"], tuple(e["workers"]), e["window"],
                                     e["elements"], deadline_s, "bounded",
                                     _addr(e["multicast"]), doc["session"])
        out.append(RoundPlan(rnd["round"], rnd["predicted_s"], gpred, send_job,
                             offset or 0.0, rate, inbound, edge))
    return out


def replicator_table(doc: dict, island: str) -> dict[int, list[tuple[tuple[str, int], int]]]:
    """The edge replicator's group table for ``island``: job -> [(destination edge
    aggregator, the worker id this island has in that edge's job)]."""
    names = [i["name"] for i in doc["islands"]]
    me = doc["islands"][names.index(island)]["address"]
    edges = {i["name"]: _addr(i["edge"]) for i in doc["islands"]}
    table = {}
    for rnd in doc["rounds"]:
        for g in rnd["groups"]:
            for e in g["edge_jobs"]:
                if me in e["workers"]:
                    table.setdefault(g["job"], []).append(
                        (edges[e["island"]], e["workers"].index(me)))
    return table
