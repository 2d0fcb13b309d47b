"""The experiments behind `ina schedule sweep-memory` / `train` and the benchmark."""

from dataclasses import replace

import numpy as np

from ina_fabric.host.schedule.model import NetConfig, Round, RoundModel, mixing_matrix
from ina_fabric.host.schedule.search import optimize
from ina_fabric.host.schedule.baselines import ring_allreduce_time, tree_allreduce_time
from ina_fabric.host.schedule.train import IslandTrainConfig, train_run, time_to_target, load_data

__all__ = ["memory_sweep", "training_comparison", "DEFAULT_SWEEP", "family_order"]

DEFAULT_SWEEP = [1e4, 1e5, 1e6, 1e7, 3e7, 1e8, 3e8, 1e9, 1e10]


def _label(c):
    return c.family if c.family != "cliques" else f"cliques-{c.k}"


def family_order(label: str):
    """Table order: pairs, one-peer, ring, cliques by size, all-to-all."""
    fixed = {"static-pairs": 0, "one-peer-exp": 1, "ring-gossip": 2, "all-to-all": 99}
    k = int(label.split("-")[1]) if label.startswith("cliques-") else 0
    return (fixed.get(label, 3), k)


def memory_sweep(topo, net: NetConfig, memories, *, seed=0, time_budget_s=30.0, progress=None):
    rows = []
    for m in memories:
        res = optimize(topo, replace(net, memory_bytes=float(m)), seed=seed,
                       time_budget_s=time_budget_s)
        per = {}
        for c in res.candidates:
            lab = _label(c)
            per[lab] = max(per.get(lab, 0.0), c.objective)
        b = res.best
        rows.append({"memory_bytes": float(m), "best": _label(b),
                     "best_k": b.k if b.family in ("cliques", "all-to-all") else
                     (2 if b.family in ("static-pairs", "one-peer-exp") else 3),
                     "rounds": len(b.schedule.rounds), "t_cycle_s": b.t_cycle,
                     "sigma2": b.sigma2, "objective": b.objective, "per_family": per,
                     "solve_s": res.solve_s})
        if progress:
            progress(rows[-1])
    labels = sorted({k for r in rows for k in r["per_family"]}, key=family_order)
    for r in rows:
        r["per_family"] = {k: r["per_family"].get(k, 0.0) for k in labels}
    return rows


def training_comparison(topo, net: NetConfig, cfg: IslandTrainConfig, *, seed=0,
                        time_budget_s=30.0, target_round=None, schedule=None):
    """Train with the optimizer's schedule and the baselines; time to a target loss.

    The target is the loss that colocated training reaches after ``target_round``
    rounds (default: half its rounds)."""
    S = net.update_bytes
    if schedule is None:
        schedule = optimize(topo, net, seed=seed, time_budget_s=time_budget_s).best
    data = load_data(cfg.seed)
    n = topo.n
    a2a = RoundModel(topo, replace(net, fpga=False)).round_time(
        Round.cliques([range(n)], n))
    comm = {
        "colocated (LAN ring all-reduce)": ring_allreduce_time(topo.colocated(), S),
        "WAN ring all-reduce": ring_allreduce_time(topo, S),
        "WAN tree all-reduce": tree_allreduce_time(topo, S),
        "WAN all-to-all, multicast, no FPGA": a2a,
    }
    traces = [train_run(k, n, cfg, exact_average=True, allreduce_s=v, data=data)
              for k, v in comm.items()]
    name = f"schedule: {_label(schedule)} x{len(schedule.schedule.rounds)} rounds (FPGA+multicast)"
    traces.append(train_run(name, n, cfg, mixing=[mixing_matrix(r) for r in schedule.schedule.rounds],
                            round_times=schedule.round_times, data=data))
    colo = traces[0]
    target = float(colo.loss[(target_round or cfg.rounds // 2) - 1])
    t0 = time_to_target(colo, target)
    rows = []
    for tr in traces:
        tt = time_to_target(tr, target)
        rows.append({"method": tr.name, "comm_s_per_round": tr.round_comm_s,
                     "time_to_target_s": tt, "gap_vs_colocated": tt / t0,
                     "final_loss": float(tr.loss[-1]), "final_test_acc": float(tr.acc[-1])})
    return {"target_loss": target, "rows": rows, "traces": traces, "schedule": schedule}
