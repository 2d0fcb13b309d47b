"""The schedule optimizer: maximise consensus contraction per second,
``-log max(sigma2(W_R...W_1), floor) / T_cycle``.

Search space (every candidate is scored by the same RoundModel and sigma2):

* structured families: all-to-all, ring gossip (ring = a short tour), static pairs,
  the one-peer exponential graph;
* rotating cliques of size k over R rounds, each round a partition of the islands into
  blocks of k (plus one remainder block).  For ``n <= exact_max_n`` every one- and
  two-round schedule of such partitions is scored exactly, by branch and bound on the
  cycle time (the objective is at most ``-log(floor) / T_cycle``); longer cycles and
  larger n are searched by seeded simulated annealing (swap two islands between blocks
  of one round), started from the mixed-radix rotation (round r groups islands that
  agree on every base-k digit but digit r: exact averaging in log_k n rounds when
  n = k^R).
"""

from dataclasses import dataclass, field
import itertools
import math
import time

import numpy as np

from .model import Round, Schedule, RoundModel, NetConfig, mixing_matrix, sigma2, objective

__all__ = ["optimize", "Candidate", "SearchResult", "ring_tour", "families",
           "k_partitions", "mixed_radix"]


@dataclass
class Candidate:
    schedule: Schedule
    family: str
    k: int
    t_cycle: float
    sigma2: float
    objective: float
    round_times: list
    method: str = "construction"

    def row(self) -> dict:
        return {"family": self.family, "k": self.k, "rounds": len(self.schedule.rounds),
                "t_cycle_s": self.t_cycle, "sigma2": self.sigma2,
                "objective": self.objective, "method": self.method}


@dataclass
class SearchResult:
    best: Candidate
    candidates: list          # best candidate per (family, k)
    solve_s: float
    evaluated: int
    exact: bool


def _score(model: RoundModel, sched: Schedule, family: str, k: int, method: str) -> Candidate:
    e = model.evaluate(sched)
    return Candidate(sched, family, k, e["t_cycle"], e["sigma2"], e["objective"],
                     e["round_times"], method)


# ------------------------------------------------------------------ structured families
def ring_tour(lat: np.ndarray) -> list[int]:
    """A short Hamiltonian cycle over the latency matrix: nearest neighbour + 2-opt."""
    n = len(lat)
    tour, left = [0], set(range(1, n))
    while left:
        nxt = min(left, key=lambda j: lat[tour[-1], j])
        tour.append(nxt)
        left.remove(nxt)
    improved = True
    while improved:
        improved = False
        for a in range(n - 1):
            for b in range(a + 2, n if a else n - 1):
                i, j, k, l = tour[a], tour[a + 1], tour[b], tour[(b + 1) % n]
                if lat[i, k] + lat[j, l] < lat[i, j] + lat[k, l] - 1e-12:
                    tour[a + 1:b + 1] = tour[a + 1:b + 1][::-1]
                    improved = True
    return tour


def families(topo) -> dict[str, Schedule]:
    n = topo.n
    tour = ring_tour(topo.latency)
    pos = {isl: p for p, isl in enumerate(tour)}
    out = {"all-to-all": Schedule([Round.cliques([range(n)], n, "all")], "all-to-all")}
    ring_in = tuple(tuple(sorted({tour[(pos[i] - 1) % n], tour[(pos[i] + 1) % n]} - {i}))
                    for i in range(n))
    out["ring-gossip"] = Schedule([Round(ring_in, "ring")], "ring-gossip")
    pairs = [(tour[p], tour[p + 1]) for p in range(0, n - 1, 2)]
    out["static-pairs"] = Schedule([Round.cliques(pairs, n, "pairs")], "static-pairs")
    rounds = []
    for t in range(max(1, math.ceil(math.log2(n)))):
        step = 1 << t
        inb = tuple((tour[(pos[i] + step) % n],) if step % n else () for i in range(n))
        rounds.append(Round(inb, f"one-peer 2^{t}"))
    out["one-peer-exp"] = Schedule(rounds, "one-peer-exp")
    return out


# ------------------------------------------------------------------ k-partitions
def k_partitions(n: int, k: int):
    """Every partition of range(n) into blocks of size k plus one block of n mod k."""
    sizes = [k] * (n // k) + ([n % k] if n % k else [])

    def rec(items, sizes):
        if not sizes:
            yield []
            return
        size, rest_sizes = sizes[0], sizes[1:]
        first, rest = items[0], items[1:]
        for combo in itertools.combinations(rest, size - 1):
            block = (first,) + combo
            remaining = [x for x in rest if x not in combo]
            # blocks of equal size are unordered: canonical = sorted by first element,
            # which holds because `first` is always the smallest remaining item; the
            # smaller remainder block must not come before a k block
            if len(rest_sizes) and size < k:
                continue
            for tail in rec(remaining, rest_sizes):
                yield [block] + tail
    # place the remainder block last in size order, but allow it to hold any items:
    # enumerate by choosing the remainder block first when it exists
    if n % k and n // k:
        r = n % k
        for rem in itertools.combinations(range(n), r):
            items = [x for x in range(n) if x not in rem]
            for tail in rec(items, [k] * (n // k)):
                yield tail + [rem]
    else:
        yield from rec(list(range(n)), sizes)


def mixed_radix(order: list[int], k: int) -> list[list[tuple[int, ...]]]:
    """Rounds of the base-k rotation over ``order`` (positions 0..n-1)."""
    n = len(order)
    R = max(1, math.ceil(math.log(n, k) - 1e-9))
    rounds = []
    for r in range(R):
        groups = {}
        for p in range(n):
            digits = [(p // k ** q) % k for q in range(R)]
            digits[r] = -1
            groups.setdefault(tuple(digits), []).append(order[p])
        rounds.append([tuple(g) for g in groups.values()])
    return rounds


# ------------------------------------------------------------------ exact search
def _exact(model: RoundModel, n: int, k: int, floor: float, deadline: float):
    parts = list(k_partitions(n, k))
    rounds = [Round.cliques(p, n, f"k={k}") for p in parts]
    times = np.array([model.round_time(r) for r in rounds])
    W = np.stack([mixing_matrix(r) for r in rounds])
    order = np.argsort(times)
    times, W = times[order], W[order]
    rounds = [rounds[i] for i in order]
    evaluated = len(rounds)

    def centred(batch):
        q = batch - batch.mean(axis=1, keepdims=True)
        return q - q.mean(axis=2, keepdims=True)

    def s2(batch):
        q = centred(batch)
        gram = np.swapaxes(q, 1, 2) @ q
        return np.sqrt(np.maximum(np.linalg.eigvalsh(gram)[:, -1], 0.0))
    s1 = s2(W)
    obj1 = np.where(np.isfinite(times), -np.log(np.maximum(s1, floor)) / times, 0.0)
    b = int(np.argmax(obj1))
    best = (obj1[b], [rounds[b]])
    # a node reaches at most k^2 others in two rounds: a row of P has <= m = min(k^2, n)
    # non-zeros, so sigma2 >= ||row - 1/n|| >= sqrt(1/m - 1/n)  (exact pruning bound)
    m = min(k * k, n)
    cap = -math.log(max(floor, math.sqrt(max(1.0 / m - 1.0 / n, 0.0))))
    for p in range(len(rounds)):
        if time.perf_counter() > deadline:
            return best, evaluated, False
        tq = times[p:] + times[p]
        ok = np.flatnonzero(cap / tq > best[0])
        if not len(ok):
            if p == 0 or cap / (2 * times[p]) <= best[0]:
                break
            continue
        qs = p + ok
        q = centred(W[qs] @ W[p])
        tt = times[p] + times[qs]
        evaluated += len(qs)
        # a lower bound on sigma2 first: three power steps on Q^T Q (Rayleigh quotient
        # <= lambda_max); only candidates whose bound could still win get eigvalsh
        gram = np.swapaxes(q, 1, 2) @ q
        v = np.ones((len(qs), n, 1))
        v[:, 0] = 2.0
        for _ in range(3):
            v = gram @ v
            v /= np.linalg.norm(v, axis=1, keepdims=True) + 1e-300
        ray = np.einsum("qi,qi->q", v[..., 0], (gram @ v)[..., 0])
        lb = np.sqrt(np.maximum(ray, 0.0))
        keep = np.flatnonzero(-np.log(np.maximum(lb, floor)) / tt > best[0])
        if not len(keep):
            continue
        sig = np.sqrt(np.maximum(np.linalg.eigvalsh(gram[keep])[:, -1], 0.0))
        val = -np.log(np.maximum(sig, floor)) / tt[keep]
        m = int(np.argmax(val))
        if val[m] > best[0]:
            best = (float(val[m]), [rounds[p], rounds[qs[keep[m]]]])
    return best, evaluated, True


# ------------------------------------------------------------------ annealing
def _anneal(model: RoundModel, init: list[list[tuple]], floor: float, rng, iters: int,
            deadline: float):
    n = model.topo.n
    state = [[list(b) for b in rnd] for rnd in init]

    def build(st):
        rs = [Round.cliques(rnd, n) for rnd in st]
        t = sum(model.round_time(r) for r in rs)
        s = sigma2(mixing_matrix(r) for r in rs)
        return objective(s, t, floor), rs
    cur, _ = build(state)
    best, best_state = cur, [[tuple(b) for b in rnd] for rnd in state]
    temp0 = max(cur, 1e-9) * 0.05
    done = 0
    for it in range(iters):
        if time.perf_counter() > deadline:
            break
        r = int(rng.integers(len(state)))
        blocks = state[r]
        if len(blocks) < 2:
            continue
        b1, b2 = rng.choice(len(blocks), 2, replace=False)
        x, y = int(rng.integers(len(blocks[b1]))), int(rng.integers(len(blocks[b2])))
        blocks[b1][x], blocks[b2][y] = blocks[b2][y], blocks[b1][x]
        new, _ = build(state)
        done += 1
        temp = temp0 * (1e-3 ** (it / max(iters - 1, 1)))
        if new >= cur or rng.random() < math.exp((new - cur) / temp):
            cur = new
            if new > best:
                best, best_state = new, [[tuple(b) for b in rnd] for rnd in state]
        else:
            blocks[b1][x], blocks[b2][y] = blocks[b2][y], blocks[b1][x]
    return best, [Round.cliques(rnd, n) for rnd in best_state], done


def optimize(topo, net: NetConfig, *, seed: int = 0, exact_max_n: int = 10,
             sizes=None, max_rounds_extra: int = 1, iters: int | None = None,
             time_budget_s: float = 50.0, model: RoundModel | None = None) -> SearchResult:
    """Best schedule for ``topo`` under ``net``; seeded and reproducible."""
    t0 = time.perf_counter()
    deadline = t0 + time_budget_s
    model = model or RoundModel(topo, net)
    n = topo.n
    rng = np.random.default_rng(seed)
    cands: list[Candidate] = []
    for name, sched in families(topo).items():
        cands.append(_score(model, sched, name, 0 if name != "all-to-all" else n, "construction"))
    evaluated = len(cands)
    exact = n <= exact_max_n
    if sizes is None:
        sizes = range(2, n) if n <= 16 else [2, 3, 4, 5, 6, 8]
    tour = ring_tour(topo.latency)
    if iters is None:
        iters = 200 if n <= 16 else 150
    for k in sizes:
        if k >= n:
            continue
        if exact:
            (val, rounds), ev, complete = _exact(model, n, k, net.sigma_floor, deadline)
            exact &= complete
            evaluated += ev
            cands.append(_score(model, Schedule(rounds, f"cliques-{k}"), f"cliques", k,
                                "exact (R<=2)" if complete else "exact, cut by time"))
        r_min = max(1, math.ceil(math.log(n, k) - 1e-9))
        for R in range(r_min, r_min + max_rounds_extra + 1):
            if exact and (R <= 2 or k * k >= n):
                continue   # covered exactly (two rounds already allow exact averaging)
            init = mixed_radix(tour, k)
            while len(init) < R:       # extra rounds: rotate the tour
                init.append(mixed_radix(tour[len(init)::] + tour[:len(init)], k)[0])
            init = init[:R]
            val, rounds, ev = _anneal(model, init, net.sigma_floor, rng, iters, deadline)
            evaluated += ev
            cands.append(_score(model, Schedule(rounds, f"cliques-{k}"), "cliques", k,
                                f"annealed (R={R}, seed {seed})"))
    # keep the best per (family, k)
    keep = {}
    for c in cands:
        key = (c.family, c.k)
        if key not in keep or c.objective > keep[key].objective:
            keep[key] = c
    table = sorted(keep.values(), key=lambda c: -c.objective)
    return SearchResult(table[0], table, time.perf_counter() - t0, evaluated, exact)
