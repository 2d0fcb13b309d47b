"""Round times of the all-reduce baselines over the same topology (no in-network help).

* ring all-reduce: 2(n-1) steps of S/n bytes around a short ring tour; each step waits
  for the slowest hop: ``2(n-1) (max_hop_latency + S / (n B_min))``;
* tree all-reduce: a binary tree (heap order over islands sorted by latency from the
  medoid root), pipelined reduce then broadcast: ``2 depth_latency + 4 S / B_min``
  (an inner node takes in two children's streams, then sends to two);
* colocated: the ring all-reduce with every latency equal to the LAN latency.
"""

import numpy as np

from .search import ring_tour

__all__ = ["ring_allreduce_time", "tree_allreduce_time"]


def ring_allreduce_time(topo, S: float) -> float:
    n = topo.n
    tour = ring_tour(topo.latency)
    hop = max(topo.latency[tour[p], tour[(p + 1) % n]] for p in range(n))
    return 2 * (n - 1) * (hop + S / n / topo.bandwidth.min())


def tree_allreduce_time(topo, S: float) -> float:
    lat = topo.latency
    root = int(np.argmin(lat.max(axis=1)))
    order = [root] + sorted((i for i in range(topo.n) if i != root), key=lambda i: lat[root, i])
    depth_lat = np.zeros(topo.n)
    for p in range(1, topo.n):
        parent = order[(p - 1) // 2]
        depth_lat[order[p]] = depth_lat[parent] + lat[parent, order[p]]
    return 2 * depth_lat.max() + 4 * S / topo.bandwidth.min()
