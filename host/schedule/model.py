"""Rounds, mixing matrices, sigma2, and the analytic round-time model.

A *round* says, for every island ``i``, the set ``inbound[i]`` of islands whose update
it receives and averages with its own: ``W[i, j] = 1 / (|inbound[i]| + 1)`` for ``j`` in
``inbound[i]`` and ``j = i``.  A clique round (disjoint cliques, each member receives
from the others) is the main case; ring gossip and the one-peer exponential graph are
rounds too.  Every round we build is doubly stochastic, so the average is preserved.

Round time (per connected component of the round, the slowest component wins).  Each
sender multicasts its update once (S bytes) at a paced rate ``r`` starting at an offset
``o_j >= 0``; receiver ``i``'s edge FPGA sums the inbound streams in line.  A slot opens
at the first contribution of a sequence number and closes at the last, so receiver ``i``
holds ``r * (skew_i + jitter) + slot_window`` bytes, where ``skew_i`` is the spread of the
stream arrival times ``o_j + d_ji`` over its inbound set.  That must fit the FPGA memory
M, so a clique is *slowed* (paced at ``r <= (M - slot_window) / (skew + jitter)``), never
declared infeasible (docs/schedule.md says why).  The send offsets are chosen with the
rate by one linear program that minimises the completion time

    T = max_i max_j (o_j + d_ji)  +  S / r,     S / r >= S / r_line,
    S / r >= S (skew_i + jitter) / (M - slot_window)  for receivers with >= 2 inbound,

where ``r_line`` is the tightest of: sender egress (B_j, or B_j / fan-out without
multicast), receiver ingress (B_i with FPGA aggregation, B_i / fan-in without), and
each backbone link's capacity shared by the multicast trees crossing it.
"""

from dataclasses import dataclass, field
import math

import numpy as np

__all__ = ["Round", "Schedule", "NetConfig", "mixing_matrix", "sigma2", "objective",
           "RoundModel", "ComponentPlan"]


@dataclass(frozen=True)
class Round:
    """``inbound[i]``: sorted tuple of islands whose update island ``i`` averages in."""
    inbound: tuple[tuple[int, ...], ...]
    label: str = ""

    @classmethod
    def cliques(cls, groups, n: int, label: str = "") -> "Round":
        inbound = [()] * n
        seen = set()
        for g in groups:
            g = tuple(sorted(int(x) for x in g))
            if seen & set(g):
                raise ValueError(f"cliques overlap: {groups}")
            seen |= set(g)
            for i in g:
                inbound[i] = tuple(j for j in g if j != i)
        return cls(tuple(inbound), label)

    @property
    def n(self) -> int:
        return len(self.inbound)

    def components(self) -> list[tuple[int, ...]]:
        """Connected components (of size >= 2) of the send graph; cliques for clique rounds."""
        n = self.n
        parent = list(range(n))

        def find(x):
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x
        for i, inb in enumerate(self.inbound):
            for j in inb:
                parent[find(i)] = find(j)
        comp = {}
        for i in range(n):
            comp.setdefault(find(i), []).append(i)
        return [tuple(c) for c in comp.values() if len(c) > 1]

    def is_clique_round(self) -> bool:
        return all(all(set(self.inbound[i]) | {i} == set(c) for i in c)
                   for c in self.components())

    def key(self):
        return self.inbound


@dataclass
class Schedule:
    rounds: list[Round]
    family: str = ""

    @property
    def n(self) -> int:
        return self.rounds[0].n


@dataclass(frozen=True)
class NetConfig:
    """What the exchange needs and what the network offers beyond the topology."""
    update_bytes: float = 1e9          # S
    memory_bytes: float = 64e6         # M, per edge FPGA
    slot_window_bytes: float = 2048.0  # one set of W slots: needed even with zero skew
    jitter_s: float = 10e-6            # arrival-time uncertainty the buffer must absorb
    multicast: bool = True
    fpga: bool = True
    sigma_floor: float = 1e-3          # consensus beyond this is worth nothing more


def mixing_matrix(rnd: Round) -> np.ndarray:
    n = rnd.n
    w = np.zeros((n, n))
    for i, inb in enumerate(rnd.inbound):
        idx = list(inb) + [i]
        w[i, idx] = 1.0 / len(idx)
    return w


def sigma2(mats) -> float:
    """Largest singular value of ``W_R ... W_1`` on the disagreement subspace (the
    complement of the all-ones vector): ``|| (I - J) P (I - J) ||_2`` with ``J = 11^T/n``."""
    mats = list(mats)
    p = np.eye(mats[0].shape[0])
    for w in mats:
        p = w @ p
    q = p - p.mean(axis=0, keepdims=True)
    q = q - q.mean(axis=1, keepdims=True)
    return float(np.linalg.norm(q, 2))


def objective(sig2: float, t_cycle: float, floor: float) -> float:
    """Consensus contraction per second: -log(max(sigma2, floor)) / T_cycle."""
    if not np.isfinite(t_cycle) or t_cycle <= 0:
        return 0.0
    return max(0.0, -math.log(max(sig2, floor)) / t_cycle)   # sigma2 = 1 + 1e-16 is 1


@dataclass
class ComponentPlan:
    """How one connected group of a round runs: who starts when, at what rate."""
    islands: tuple[int, ...]
    offsets: dict[int, float]          # sender -> start offset (s)
    rate: float                        # bytes/s, every sender of the component
    time: float                        # completion of the component (s)
    completion: dict[int, float]       # receiver -> time its aggregate is complete
    skew: dict[int, float]             # receiver -> arrival spread (s)
    buffer: dict[int, float]           # receiver -> FPGA bytes needed at that rate
    line_rate: float                   # the rate without memory limits
    memory_bound: bool                 # slowed by M?


class RoundModel:
    """The analytic model: per-round plans (cached) for a topology and a NetConfig."""

    def __init__(self, topo, net: NetConfig):
        self.topo, self.net = topo, net
        self._cache: dict = {}

    # ---------------------------------------------------------------- line-rate caps
    def _line_rate(self, rnd: Round, comp) -> float:
        t, net = self.topo, self.net
        out = {j: [] for j in comp}
        for i in comp:
            for j in rnd.inbound[i]:
                out[j].append(i)
        caps = []
        for j in comp:
            if out[j]:
                caps.append(t.bandwidth[j] / (1 if net.multicast else len(out[j])))
        for i in comp:
            k = len(rnd.inbound[i])
            if k:
                caps.append(t.bandwidth[i] / (1 if net.fpga else k))
        if not t.full_mesh or not net.multicast:
            caps.append(self._link_share(rnd))
        return min(caps)

    def _link_share(self, rnd: Round) -> float:
        """Tightest capacity / (number of trees on it) over backbone hops, round-wide."""
        t, net = self.topo, self.net
        load: dict[tuple[int, int], int] = {}
        for j in range(rnd.n):
            hops = set()
            dests = [i for i in range(rnd.n) if j in rnd.inbound[i]]
            for i in dests:
                path = t.path_links(j, i)
                if net.multicast:
                    hops |= set(path)
                else:
                    for h in path:
                        load[h] = load.get(h, 0) + 1
            for h in hops:
                load[h] = load.get(h, 0) + 1
        if not load:
            return math.inf
        return min(t.link_capacity(*h) / c for h, c in load.items())

    # ---------------------------------------------------------------- the LP
    def plan_component(self, rnd: Round, comp: tuple[int, ...]) -> ComponentPlan:
        key = (tuple(rnd.inbound[i] for i in comp), comp,
               None if self.topo.full_mesh and self.net.multicast else rnd.key())
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        plan = self._solve(rnd, comp)
        self._cache[key] = plan
        return plan

    def _solve(self, rnd: Round, comp) -> ComponentPlan:
        from scipy.optimize import linprog
        from scipy.sparse import coo_matrix
        net, d = self.net, self.topo.latency
        S = net.update_bytes
        r_line = self._line_rate(rnd, comp)
        senders = sorted({j for i in comp for j in rnd.inbound[i]})
        recv = [i for i in comp if rnd.inbound[i]]
        # fast path: all start at once at line rate and the memory holds it -> optimal,
        # since T >= max d_ji + S / r_line for any offsets >= 0
        u0 = S / r_line
        arr0 = {i: d[list(rnd.inbound[i]), i] for i in recv}
        need0 = {i: (r_line * (np.ptp(a) + net.jitter_s) + net.slot_window_bytes
                     if net.fpga and len(a) >= 2 else
                     (net.slot_window_bytes if net.fpga else 0.0)) for i, a in arr0.items()}
        if max(need0.values()) <= net.memory_bytes:
            completion = {i: float(a.max()) + u0 for i, a in arr0.items()}
            return ComponentPlan(tuple(comp), {j: 0.0 for j in senders}, r_line,
                                 max(completion.values()), completion,
                                 {i: float(np.ptp(a)) for i, a in arr0.items()}, need0,
                                 r_line, False)
        so = {j: k for k, j in enumerate(senders)}
        ns, nr = len(senders), len(recv)
        # variables: o (ns) | A (nr) | m (nr) | s | a | u
        iA, im = ns, ns + nr
        i_s, i_a, i_u = ns + 2 * nr, ns + 2 * nr + 1, ns + 2 * nr + 2
        nv = i_u + 1
        rows, cols, vals, rhs = [], [], [], []
        r = 0

        def add(entries, b):
            nonlocal r
            for c, v in entries:
                rows.append(r), cols.append(c), vals.append(v)
            rhs.append(b)
            r += 1
        skewed = [q for q, i in enumerate(recv) if net.fpga and len(rnd.inbound[i]) >= 2]
        for q, i in enumerate(recv):
            for j in rnd.inbound[i]:
                add([(so[j], 1.0), (iA + q, -1.0)], -d[j, i])       # A_i >= o_j + d_ji
                if q in skewed:
                    add([(im + q, 1.0), (so[j], -1.0)], d[j, i])    # m_i <= o_j + d_ji
            add([(iA + q, 1.0), (i_a, -1.0)], 0.0)                  # a >= A_i
            if q in skewed:
                add([(iA + q, 1.0), (im + q, -1.0), (i_s, -1.0)], 0.0)  # s >= A_i - m_i
        mem = net.memory_bytes - net.slot_window_bytes
        if skewed:
            if mem <= 0:
                return self._infeasible(rnd, comp, r_line)
            add([(i_s, S / mem), (i_u, -1.0)], -S * net.jitter_s / mem)  # u >= S(s+jit)/M'
        bounds = [(0, None)] * ns + [(None, None)] * (2 * nr) + [(0, None)] * 2 + \
                 [(S / r_line, None)]
        c = np.zeros(nv)
        c[i_a] = c[i_u] = 1.0
        c[i_s] = 1e-6      # among optimal plans, the one with the least skew (memory)
        a_ub = coo_matrix((vals, (rows, cols)), shape=(r, nv)).tocsr()
        res = linprog(c, A_ub=a_ub, b_ub=rhs, bounds=bounds, method="highs")
        if res.status != 0:
            raise RuntimeError(f"round-time LP failed: {res.message}")
        x = res.x
        o = {j: float(x[so[j]]) for j in senders}
        u = float(x[i_u])
        rate = S / u
        arrivals = {i: [o[j] + d[j, i] for j in rnd.inbound[i]] for i in recv}
        skew = {i: (max(a) - min(a)) for i, a in arrivals.items()}
        buf = {i: (rate * (skew[i] + net.jitter_s) + net.slot_window_bytes
                   if net.fpga and len(rnd.inbound[i]) >= 2 else
                   (net.slot_window_bytes if net.fpga else 0.0)) for i in recv}
        completion = {i: max(a) + u for i, a in arrivals.items()}
        return ComponentPlan(tuple(comp), o, rate, max(completion.values()), completion,
                             skew, buf, r_line, rate < r_line * (1 - 1e-9))

    def _infeasible(self, rnd, comp, r_line):
        return ComponentPlan(tuple(comp), {}, 0.0, math.inf, {}, {}, {}, r_line, True)

    # ---------------------------------------------------------------- public
    def plan(self, rnd: Round) -> list[ComponentPlan]:
        return [self.plan_component(rnd, c) for c in rnd.components()]

    def round_time(self, rnd: Round) -> float:
        plans = self.plan(rnd)
        return max((p.time for p in plans), default=0.0)

    def evaluate(self, sched: Schedule) -> dict:
        times = [self.round_time(r) for r in sched.rounds]
        t = float(sum(times))
        s2 = sigma2(mixing_matrix(r) for r in sched.rounds)
        return {"round_times": times, "t_cycle": t, "sigma2": s2,
                "objective": objective(s2, t, self.net.sigma_floor)}
