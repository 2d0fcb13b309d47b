"""Discrete-event simulation of a schedule over the topology, chunk by chunk.

Each update is cut into C chunks (one chunk = a batch of packets).  Every chunk is an
event that passes through FIFO servers in order: the sender's access egress (one copy
with multicast, one per receiver without), each backbone hop of the routed path (a
multicast tree copies once per hop; the hop's capacity is shared by every stream that
crosses it) with its propagation delay, then the receiver's edge FPGA and access ingress.
Senders pace chunks at the rate and start offsets of the plan (what the host runtime
would do); each stream also gets a seeded constant extra delay in [0, jitter].

With FPGA aggregation the slot of chunk c at receiver i opens at the first contribution
and closes at the last; the aggregate then crosses the access link once.  The simulator
tracks the open slots over time, so the peak FPGA buffer is measured, not assumed, and a
peak above M (beyond the chunk granularity: one chunk, plus one per store-and-forward
hop) is reported as an overflow.  Without aggregation every inbound copy crosses
the access link.

FIFO servers are solved exactly and vectorized: with arrivals ``a`` (sorted) and service
times ``s``, departures are ``d_k = max(a_k, d_{k-1}) + s_k = cs_k + max_{m<=k}(a_m -
cs_{m-1})``.  Hops shared in both orders by different streams are iterated to a fixed
point.
"""

from dataclasses import dataclass

import numpy as np

from .model import Round, RoundModel

__all__ = ["fifo", "simulate_round", "simulate_schedule", "RoundSim"]


def fifo(arrivals: np.ndarray, service) -> np.ndarray:
    """Departure times of a FIFO server (arrival order, ties by index)."""
    arrivals = np.asarray(arrivals, float)
    service = np.broadcast_to(np.asarray(service, float), arrivals.shape)
    order = np.argsort(arrivals, kind="stable")
    a, s = arrivals[order], service[order]
    cs = np.cumsum(s)
    prev = np.concatenate(([0.0], cs[:-1]))
    dep = cs + np.maximum.accumulate(a - prev)
    out = np.empty_like(dep)
    out[order] = dep
    return out


@dataclass
class RoundSim:
    time: float                     # simulated round time (s)
    predicted: float                # the analytic model's round time (s)
    completion: dict                # receiver -> time
    peak_buffer: dict               # receiver -> peak FPGA bytes (incl. slot window)
    overflows: int                  # receivers whose peak exceeded M
    chunks: int

    @property
    def error(self) -> float:
        return abs(self.time - self.predicted) / self.predicted if self.predicted else 0.0


def simulate_round(model: RoundModel, rnd: Round, chunks: int = 256, seed: int = 0) -> RoundSim:
    topo, net = model.topo, model.net
    plans = model.plan(rnd)
    if any(not np.isfinite(p.time) for p in plans):
        return RoundSim(np.inf, np.inf, {}, {}, 0, chunks)
    rng = np.random.default_rng(seed)
    S, C = net.update_bytes, chunks
    s = S / C
    c_idx = np.arange(C)
    n = rnd.n
    rate = {}
    offset = {}
    for p in plans:
        for j, o in p.offsets.items():
            rate[j], offset[j] = p.rate, o
    # streams: (sender j, receiver i); with multicast one egress copy feeds all
    dests = {j: [i for i in range(n) if j in rnd.inbound[i]] for j in range(n)}
    egress = {}
    for j, ds in dests.items():
        if not ds:
            continue
        paced = offset[j] + c_idx * (s / rate[j])
        if net.multicast:
            egress[j] = {i: d for i, d in zip(ds, [fifo(paced, s / topo.bandwidth[j])] * len(ds))}
        else:
            arr = np.repeat(paced, len(ds))            # copies of chunk c back to back
            dep = fifo(arr, s / topo.bandwidth[j]).reshape(C, len(ds))
            egress[j] = {i: dep[:, q] for q, i in enumerate(ds)}
    # backbone: per directed hop, the set of (sender, hop index) flows that cross it
    paths = {(j, i): topo.path_links(j, i) for j, ds in dests.items() for i in ds}
    flows: dict[tuple[int, int], set[int]] = {}
    for (j, i), path in paths.items():
        for h in path:
            flows.setdefault(h, set()).add(j) if net.multicast else \
                flows.setdefault(h, set()).add((j, i))
    hop_out: dict = {}          # (hop, flow) -> departure times from the hop's far end

    def upstream(flow, path, k):
        j = flow if net.multicast else flow[0]
        if k == 0:
            i0 = path[-1][1] if net.multicast else flow[1]
            return egress[j][i0] if not net.multicast else next(iter(egress[j].values()))
        return hop_out.get((path[k - 1], flow))
    flow_path = {}
    for (j, i), path in paths.items():
        for k, h in enumerate(path):
            flow_path.setdefault((h, j if net.multicast else (j, i)), (path, k))
    for _ in range(50):
        changed = False
        for h, fl in flows.items():
            fl = sorted(fl, key=str)
            ins = []
            for f in fl:
                path, k = flow_path[(h, f)]
                up = upstream(f, path, k)
                if up is None:  # upstream not computed yet: assume no queueing so far
                    j = f if net.multicast else f[0]
                    up = egress[j][next(iter(egress[j]))] + sum(
                        topo.hop_latency[a, b] for a, b in path[:k])
                ins.append(up)
            dep = fifo(np.concatenate(ins), s / topo.link_capacity(*h))
            for q, f in enumerate(fl):
                new = dep[q * C:(q + 1) * C] + topo.hop_latency[h]
                old = hop_out.get((h, f))
                if old is None or np.max(np.abs(old - new)) > 1e-12:
                    changed = True
                hop_out[(h, f)] = new
        if not changed:
            break
    jit = {}
    completion, peak, overflows = {}, {}, 0
    for i in range(n):
        inb = rnd.inbound[i]
        if not inb:
            continue
        arr = []
        for j in inb:
            path = paths[(j, i)]
            f = j if net.multicast else (j, i)
            jit[(j, i)] = rng.uniform(0.0, net.jitter_s)
            arr.append(hop_out[(path[-1], f)] + jit[(j, i)])
        arr = np.stack(arr)                    # (k-1, C)
        if net.fpga:
            opened, closed = arr.min(axis=0), arr.max(axis=0)
            dep = fifo(closed, s / topo.bandwidth[i])
            # open slots over time: +1 at open, -1 at close (a zero-length slot never counts)
            t = np.concatenate([opened, closed])
            step = np.concatenate([np.ones(C), -np.ones(C)])
            order = np.lexsort((step, t))
            open_now = np.cumsum(step[order])
            need = (open_now.max() if len(inb) >= 2 else 0) * s + net.slot_window_bytes
            peak[i] = float(need)
            # granularity: the model counts bytes, the simulator whole chunks, and a
            # chunk is stored and forwarded at every hop (a packet's delay, times the
            # chunk/packet ratio): allow one chunk per hop of the longest inbound path
            hops = max(len(paths[(j, i)]) for j in inb)
            if need > net.memory_bytes + s * (1 + hops):
                overflows += 1
        else:
            dep = fifo(arr.ravel(), s / topo.bandwidth[i])
        completion[i] = float(dep.max())
    predicted = max((p.time for p in plans), default=0.0)
    return RoundSim(max(completion.values(), default=0.0), predicted, completion, peak,
                    overflows, C)


def simulate_schedule(model: RoundModel, sched, chunks: int = 256, seed: int = 0):
    """Simulate every round (a barrier between rounds); list of RoundSim."""
    return [simulate_round(model, r, chunks, seed + k) for k, r in enumerate(sched.rounds)]
