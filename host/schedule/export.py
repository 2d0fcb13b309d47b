"""The schedule as JSON for the host runtime: per round, one aggregation job per clique
with its multicast group, and each member island's edge-FPGA job entry.

Each edge job uses the keys of ``ina_fabric.protocol.jobtable.load_jobs_toml`` (``id``,
``workers``, ``multicast``, ``window``, ``elements``), so
``JobConfig(id, tuple(workers), window, elements, mcast=...)`` builds it: the FPGA at
island i aggregates the streams of the clique's other members (its own host adds its own
update) and sends the RESULT to its own host (the ``multicast`` key, i.e. the result
destination); each sender's WAN multicast group is in ``send[].wan_group`` (one group
per clique; one per sender for non-clique rounds).  Job ids are unique over
the whole cycle, so every round's jobs can be loaded at once and the host switches job
id as the rounds turn.
"""

import ipaddress
import json

__all__ = ["schedule_json", "write_schedule_json", "MCAST_BASE", "MCAST_PORT"]

MCAST_BASE = ipaddress.IPv4Address("239.192.0.0")   # organisation-local scope (RFC 2365)
MCAST_PORT = 47010


def _addr(topo, i, port_base=47000):
    a = topo.addresses[i]
    return a if a else f"10.{100 + i // 250}.{i % 250}.1:{port_base}"


def schedule_json(topo, net, cand, model, *, window=8, elements=64, note="",
                  result_to=None) -> dict:
    """``result_to``: per island, where its edge sends the aggregate (``ip:port`` of its
    host); default: the island's own address."""
    rounds, job = [], 1
    for r, rnd in enumerate(cand.schedule.rounds):
        plans = {p.islands: p for p in model.plan(rnd)}
        groups = []
        for comp, p in plans.items():
            clique = all(set(rnd.inbound[i]) | {i} == set(comp) for i in comp)
            # WAN multicast: one group per clique (members drop their own copy), else one
            # group per sender holding exactly its receivers
            senders = sorted(p.offsets)
            group_of = {}
            for j in senders:
                if clique and j != senders[0]:
                    group_of[j] = group_of[senders[0]]
                else:
                    group_of[j] = f"{MCAST_BASE + (job << 6) + len(group_of)}:{MCAST_PORT}"
            edge = []
            for i in comp:
                if rnd.inbound[i]:
                    edge.append({"island": topo.names[i], "id": job,
                                 "workers": [_addr(topo, j) for j in rnd.inbound[i]],
                                 # the edge FPGA's RESULT goes to its own host
                                 "multicast": (result_to[i] if result_to
                                               else _addr(topo, i)),
                                 "window": window, "elements": elements,
                                 "buffer_bytes": round(p.buffer.get(i, 0.0)),
                                 "skew_ms": 1e3 * p.skew.get(i, 0.0)})
            groups.append({
                "job": job, "members": [topo.names[i] for i in comp], "clique": clique,
                "send": [{"island": topo.names[j], "offset_ms": 1e3 * o,
                          "wan_group": group_of[j],
                          "to": [topo.names[i] for i in comp if j in rnd.inbound[i]]}
                         for j, o in sorted(p.offsets.items())],
                "rate_gbps": p.rate * 8 / 1e9, "memory_bound": bool(p.memory_bound),
                "predicted_s": p.time, "edge_jobs": edge})
            job += 1
        rounds.append({"round": r, "predicted_s": cand.round_times[r], "groups": groups})
    return {
        "format": "ina-schedule/1", "note": note,
        "islands": [{"name": nm, "address": _addr(topo, i)} for i, nm in enumerate(topo.names)],
        "update_bytes": net.update_bytes, "memory_bytes": net.memory_bytes,
        "jitter_us": net.jitter_s * 1e6, "multicast": net.multicast, "fpga": net.fpga,
        "family": cand.family, "k": cand.k, "t_cycle_s": cand.t_cycle,
        "sigma2": cand.sigma2, "objective_per_s": cand.objective, "rounds": rounds,
    }


def write_schedule_json(path, doc):
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1)
        fh.write("\n")
