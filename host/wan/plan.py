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

* ``198.18.k.1:47000``   the island's host (K = 1): sends its update, receives its
  aggregate; with K hosts per island, host h is ``198.18.k.(h+1):47000`` and host 0
  sends the island's update (the average of its K hosts);
* ``198.18.k.254:47001`` the edge replicator (the island's endpoint in schedule.json):
  takes the host's update once and makes the copies for the other islands;
* ``198.18.k.254:19900`` the edge aggregator (``ina switch``): sums what arrives from
  the other islands' replicators and sends the sum to its own host (K = 1) or to the
  replicator, which copies it to each of the K hosts (K > 1); with K > 1 it also holds
  the island's intra-island job (its K hosts as workers, the RESULT to each of them).
"""

from dataclasses import dataclass
import dataclasses

import numpy as np

from ina_fabric.protocol.fields import HEADER_BYTES

__all__ = ["WIRE_OVERHEAD", "HOST_PORT", "REPLICATOR_PORT", "EDGE_PORT", "LabNet",
           "payload_fraction", "edge_window", "schedule_topology", "net_config",
           "candidates", "pick", "export", "RoundPlan", "island_plan",
           "replicator_table", "result_table", "intra_job", "intra_predicted_s",
           "cycle_with_round_cost", "best_with_round_cost",
           "schedule_label", "at_line_rate"]

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
    hosts: int = 1               # K hosts per island: host h is <prefix>.k.(h+1)

    @classmethod
    def from_lab(cls, topo, elements=256):
        """From a built lab's ``Topology`` (``host.lab``): its params and switches."""
        p = topo.params
        from ina_fabric.host.lab.topology import parse_rate
        return cls(len(topo.switches), parse_rate(p["rate"]), parse_rate(p["wan_rate"]),
                   float(p["delay_scale"]), elements, hosts=int(p.get("hosts", 1)))

    def host(self, k, h=0) -> str:
        return f"{self.prefix}.{k}.{h + 1}:{HOST_PORT}"

    def island_hosts(self, k) -> list[str]:
        return [self.host(k, h) for h in range(self.hosts)]

    def replicator(self, k) -> str:
        return f"{self.prefix}.{k}.254:{REPLICATOR_PORT}"

    def edge(self, k) -> str:
        return f"{self.prefix}.{k}.254:{EDGE_PORT}"


def schedule_topology(lab: LabNet, source_topology=None):
    """The optimizer's WanTopology for the lab: same islands and geography, latencies x
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


def cycle_with_round_cost(cand, round_cost: float) -> float:
    """The cycle time of ``cand`` when every round also costs ``round_cost`` seconds
    that the optimizer's round model does not see (K > 1: the intra-island step and the
    WAN step's guard, once per round, before the WAN exchange)."""
    return cand.t_cycle + len(cand.round_times) * round_cost


def best_with_round_cost(cands: dict, round_cost: float, floor: float) -> str:
    """The optimizer's objective (consensus contraction per second) over the same
    candidates, each cycle made longer by ``round_cost`` per round: a fixed cost per round
    favours schedules with fewer rounds per cycle. ``round_cost = 0``: the optimizer's
    own choice."""
    from ina_fabric.host.schedule.model import objective
    return max(sorted(cands), key=lambda k: objective(
        cands[k].sigma2, cycle_with_round_cost(cands[k], round_cost), floor))


def pick(cands: dict, label: str):
    if label not in cands:
        raise ValueError(f"no schedule {label!r}; have {', '.join(sorted(cands))}")
    return cands[label]


def export(lab: LabNet, topo, net, cand, model, note="", job_base=0) -> dict:
    """schedule.json for the lab: the optimizer's export, with each island's host (where
    its edge sends the aggregate) and edge aggregator, and each edge job's window from M.
    ``job_base`` is added to every job id (runs one after another never share an id)."""
    from ina_fabric.host.schedule.export import schedule_json
    w = edge_window(net.memory_bytes, lab.elements)
    # K = 1: the edge's RESULT goes to the island's host; K > 1: to the island's
    # replicator, which copies it to each host (the network's fan-out, not a host's)
    to = [lab.host(k) if lab.hosts == 1 else lab.replicator(k) for k in range(lab.islands)]
    doc = schedule_json(topo, net, cand, model, window=w, elements=lab.elements, note=note,
                        result_to=to)
    for k, isl in enumerate(doc["islands"]):
        isl["host"], isl["edge"] = lab.host(k), lab.edge(k)
        isl["hosts"] = lab.island_hosts(k)
    ids = [job_base]
    for rnd in doc["rounds"]:
        for g in rnd["groups"]:
            g["job"] += job_base
            ids.append(g["job"])
            for e in g["edge_jobs"]:
                e["id"] += job_base
                ids.append(e["id"])
    doc["label"] = schedule_label(cand)
    doc["hosts_per_island"] = lab.hosts
    if lab.hosts > 1:
        # the intra-island reduction: one job on every island's edge aggregator, its K
        # hosts as workers, used once per round (the r-th round numbers its datagrams
        # from r x P); its RESULT (the island's sum) goes back to each of the K hosts
        doc["intra"] = {"job": max(ids) + 1, "window": w, "elements": lab.elements,
                        "predicted_s": intra_predicted_s(lab, net.update_bytes)}
    # the run's session id: every edge job of this run is installed with it and every
    # DATA and RESULT carries it (one multicast DATA reaches several edges unchanged)
    from ina_fabric.protocol.jobtable import new_session
    doc["session"] = new_session()
    return doc


def intra_predicted_s(lab: LabNet, update_bytes: float) -> float:
    """The intra-island step's predicted time: every host sends its P datagrams paced at
    its link's payload rate; the edge's RESULT for a slot leaves as soon as the K-th
    datagram of the slot is in, and the last one takes one more datagram time down the
    host link: ``(P + 1) x E*4 / rate`` (the bridge's own latency is microseconds)."""
    rate = lab.rate_bits / 8 * payload_fraction(lab.elements)
    npk = -(-int(update_bytes) // (4 * lab.elements))
    return (npk + 1) * lab.elements * 4 / rate


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


def intra_job(doc: dict, island: str, deadline_s: float):
    """The intra-island job of ``island`` on its edge aggregator (K > 1; else None): its
    hosts as workers, bounded with ``deadline_s``, the RESULT to every worker."""
    if doc.get("hosts_per_island", 1) == 1:
        return None
    from ina_fabric.protocol.jobtable import JobConfig
    isl = next(i for i in doc["islands"] if i["name"] == island)
    a = doc["intra"]
    return JobConfig(a["job"], tuple(isl["hosts"]), a["window"], a["elements"], deadline_s,
                     "bounded", None, doc["session"])


def result_table(doc: dict, island: str) -> dict[int, list[tuple[str, int]]]:
    """K > 1: the edge replicator's RESULT fan-out for ``island``: each of its edge jobs
    -> the island's hosts (every host gets the one aggregate stream). K = 1: empty (the
    edge sends to the host itself)."""
    if doc.get("hosts_per_island", 1) == 1:
        return {}
    isl = next(i for i in doc["islands"] if i["name"] == island)
    hosts = [_addr(h) for h in isl["hosts"]]
    return {e["id"]: list(hosts) for rnd in doc["rounds"] for g in rnd["groups"]
            for e in g["edge_jobs"] if e["island"] == island}


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
