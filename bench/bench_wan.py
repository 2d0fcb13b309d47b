"""DoubleZero end to end on the wan9 lab: the optimizer's schedule run by real islands
(edge aggregators, edge replicators, torchrun per island) against Gloo's ring over the
same WAN and colocated training; per-round time measured against the model; the memory
sweep measured next to the predicted one. Needs root (network namespaces)."""

import argparse
import pathlib
import time

import numpy as np

from ina_fabric.bench._results import write

__all__ = ["main", "plot_folder"]


def _sizes(text) -> list[float]:
    """``--memory``: comma-separated sizes, or a one-line usage error."""
    from ina_fabric.host.commands import parse_size
    try:
        out = [float(parse_size(m)) for m in text.split(",")]
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not out or min(out) <= 0:
        raise argparse.ArgumentTypeError("--memory: sizes must be positive")
    return out


def _rate(text) -> int:
    from ina_fabric.host.lab.topology import TopologyError, parse_rate
    try:
        return parse_rate(text)
    except TopologyError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _lab_id(text) -> str:
    from ina_fabric.host.lab.netns import check_id
    try:
        return check_id(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


#: the time-triggered round start's guard (``runner.run_schedules``): the latest host's
#: ready time + GUARD_S
GUARD_S = 0.03
#: K > 1: the WAN step starts at the round's start + the predicted intra-island step +
#: WAN_GUARD_S (the intra step is paced and ends on time: measured 0.99 of its prediction)
WAN_GUARD_S = 0.005


def _params(hidden: int) -> int:
    return 64 * hidden + hidden + hidden * 10 + 10


def main(argv=()):
    ap = _parser()
    a = ap.parse_args(argv)
    if a.quick:
        a.rounds, a.sweep_rounds, a.kinds = 8, 2, "none"
    from ina_fabric.host.lab import available
    why = available()
    if why:
        print(f"wan: skipped: {why}")
        return 0
    from ina_fabric.host.wan import plan as P, runner as R
    mems = a.memory
    if a.delay_scale < 0 or a.rounds < 2 or a.sweep_rounds < 1 or a.hidden < 1:
        ap.error("need --delay-scale >= 0, --rounds >= 2, --sweep-rounds >= 1, --hidden >= 1")
    if not 1 <= a.hosts <= 8:
        ap.error("--hosts: 1..8 hosts per island")
    lnet = P.LabNet(9, a.rate, a.wan_rate, a.delay_scale, 256, hosts=a.hosts)
    topo = P.schedule_topology(lnet)
    S = _params(a.hidden) * 4
    jitter = a.jitter_ms / 1e3
    # K > 1: every round also has the intra-island step and the WAN step's guard
    # (WAN_GUARD_S), which the optimizer's round model does not see; the choice and every
    # prediction below include them (the optimizer's own choice is kept as "best_wan_only")
    round_cost = P.intra_predicted_s(lnet, S) + WAN_GUARD_S if a.hosts > 1 else 0.0
    print(f"wan9 lab: {a.hosts} host(s) per island, hosts {a.rate / 1e6:g} Mbit/s, WAN {a.wan_rate / 1e6:g} Mbit/s, "
          f"delays x {a.delay_scale:g}; update "
          f"{S} B (MLP 64-{a.hidden}-10), {lnet.elements} elements per packet")
    # -- the optimizer at every M ---------------------------------------------------
    opt, wan_only = _optimize(P, lnet, topo, mems, S, jitter, round_cost)
    runs, train_small, train_a2a = _plan_runs(ap, a, P, lnet, topo, opt, mems, jitter)
    train = {"seed": 0, "alpha": 0.5, "hidden": a.hidden, "lr": a.lr,
             "local_steps": a.local_steps, "batch": 32}
    t_all = time.monotonic()
    res, gloo, colo = _run_labs(a, R, lnet, runs, train)
    # -- figures ----------------------------------------------------------------------
    sums = {r["name"]: R.summarize(res["events"][r["name"]]) for r in runs}
    base = {k: R.summarize(v) for k, v in {**gloo, **colo}.items()}
    target = None
    if "colocated" in base:
        c = base["colocated"]
        target = c["loss"][len(c["loss"]) // 2 - 1]
    rows = [_row(r, sums[r["name"]], res, a, P, R, lnet, opt, target) for r in runs]
    fig = _figures(a, R, S, lnet, train, round_cost, mems, opt, wan_only, sums, rows,
                   t_all, base, target, train_small)
    _print(fig, rows)
    out = write("wan", fig)
    folder = plot_folder(a.plot, out)
    if folder is not None:
        _plots(folder, fig, sums, base, opt, mems, topo, train_small,
               train_a2a, lnet, round_cost)
    return 0


def plot_folder(plot, results_file: pathlib.Path) -> pathlib.Path | None:
    """Where ``--plot`` puts the PNGs: beside the results file by default (a git-ignored
    folder), the folder given, or nowhere for ''. Never a tracked folder by default."""
    if plot is None:
        return pathlib.Path(results_file).parent
    return pathlib.Path(plot) if plot else None


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ina bench wan", description=__doc__.split("\n\n")[0])
    ap.add_argument("--lab", default="wan9", choices=["wan9"], help="the lab topology")
    ap.add_argument("--lab-id", type=_lab_id, default="wanb", help="lab id (unique on this machine)")
    ap.add_argument("--hosts", type=int, default=1, metavar="K",
                    help="hosts per island (K > 1: the intra-island reduction through "
                         "the island's edge aggregator, then the island's update once)")
    ap.add_argument("--rate", type=_rate, default="2mbit", help="host links (LAN) rate")
    ap.add_argument("--wan-rate", type=_rate, default="2mbit", help="inter-island link rate")
    ap.add_argument("--delay-scale", type=float, default=1.0,
                    help="x geographic one-way latency (1: geographic)")
    ap.add_argument("--memory", type=_sizes, default="9956,16K,64K,1M",
                    help="edge memory settings M, bytes (the first is the gateware's "
                         "default core; the first and last get the training runs)")
    ap.add_argument("--hidden", type=int, default=256, help="MLP hidden units (update size)")
    ap.add_argument("--rounds", type=int, default=30, help="rounds of each training run")
    ap.add_argument("--sweep-rounds", type=int, default=4,
                    help="rounds of each memory-sweep and schedule-kind run")
    ap.add_argument("--local-steps", type=int, default=8)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--jitter-ms", type=float, default=5.0,
                    help="arrival-time uncertainty the optimizer budgets for")
    ap.add_argument("--kinds", default="all",
                    help="schedule kinds run at the largest M: all, none, or a list")
    ap.add_argument("--no-baselines", action="store_true", help="schedules only")
    ap.add_argument("--plot", default=None, metavar="DIR",
                    help="folder for the PNGs (default: beside wan.json, under the results "
                         "folder; '' for none). Never docs/ unless asked: the PNGs there "
                         "are the record")
    ap.add_argument("--quick", action="store_true",
                    help="8 training rounds, 2 rounds per sweep run, no kinds")
    return ap


def _optimize(P, lnet, topo, mems, S, jitter, round_cost):
    """The optimizer at every edge memory M: (best, candidates, model, net) per M, and the
    WAN-only best (without the intra-island step's cost)."""
    opt, wan_only = {}, {}
    for m in mems:
        net = P.net_config(lnet, S, m, jitter)
        wan_best, cands, model = P.candidates(topo, net, time_budget_s=30)
        best = P.best_with_round_cost(cands, round_cost, net.sigma_floor) \
            if round_cost else wan_best
        opt[m] = (best, cands, model, net)
        wan_only[m] = wan_best

        def cyc(label):
            return P.cycle_with_round_cost(cands[label], round_cost) * 1e3
        print(f"  M = {m:9.0f} B (edge window {P.edge_window(m, lnet.elements)}): best "
              f"{best}, cycle {cyc(best):.0f} ms; all-to-all {cyc('all-to-all'):.0f} ms; "
              f"cliques-3 {cyc('cliques-3'):.0f} ms" +
              (f" (with the intra-island step, {round_cost * 1e3:.0f} ms a round; WAN "
               f"only: best {wan_best})" if round_cost else ""), flush=True)

    return opt, wan_only


def _plan_runs(ap, a, P, lnet, topo, opt, mems, jitter):
    """The runs: training at the smallest and largest M (and all-to-all), the memory
    sweep, the line-rate control and the schedule kinds. Returns (runs, the small-M
    training run's name, the all-to-all training run's name)."""
    runs, job_base = [], 0

    def add(label, m, rounds, kind):
        nonlocal job_base
        name = f"{label}@{m:.0f}" + ("-line-rate" if kind == "control" else "")
        if any(r["name"] == name for r in runs):
            return name
        best, cands, model, net = opt[m]
        cand = P.pick(cands, label)
        doc = P.export(lnet, topo, net, cand, model, job_base=job_base,
                       note=f"ina bench wan: {label} at M = {m:.0f} B")
        if kind == "control":
            doc = P.at_line_rate(doc, topo.bandwidth[0])
        job_base += 100
        skew = max((e["skew_ms"] for r in doc["rounds"] for g in r["groups"]
                    for e in g["edge_jobs"]), default=0.0) / 1e3
        pred = max(r["predicted_s"] for r in doc["rounds"])
        rounds = max(rounds, len(doc["rounds"]))
        runs.append({"name": name, "label": label, "memory": m, "kind": kind, "doc": doc,
                     "rounds": rounds, "deadline_s": max(0.25, 4 * (skew + jitter)),
                     "timeout_s": 2 * pred + 1.0})
        return name

    train_small = add(opt[mems[0]][0], mems[0], a.rounds, "train")
    train_large = add(opt[mems[-1]][0], mems[-1], a.rounds, "train")
    train_a2a = add("all-to-all", mems[-1], a.rounds, "train")
    for m in mems:
        for label in (opt[m][0], "all-to-all", "cliques-3"):
            add(label, m, a.sweep_rounds, "sweep")
    # the control: all-to-all at the smallest M but at line rate, as if memory were free
    add("all-to-all", mems[0], a.sweep_rounds, "control")
    if a.kinds != "none":
        labels = sorted(opt[mems[-1]][1]) if a.kinds == "all" else a.kinds.split(",")
        bad = [x for x in labels if x not in opt[mems[-1]][1]]
        if bad:
            ap.error(f"--kinds: unknown {', '.join(bad)}; have "
                     f"{', '.join(sorted(opt[mems[-1]][1]))}")
        for label in labels:
            add(label, mems[-1], a.sweep_rounds, "kind")
    return runs, train_small, train_a2a


def _run_labs(a, R, lnet, runs, train):
    """The WAN lab (the schedules, then Gloo's ring), then the colocated lab (Gloo with
    zero WAN delay). Returns (schedule results, Gloo WAN runs, colocated runs)."""
    from ina_fabric.host.lab import down, list_labs
    if a.lab_id in list_labs():
        down(a.lab_id)
    # -- the WAN lab: schedules, then Gloo's ring ------------------------------------
    print(f"wan9 lab {a.lab_id}: up, edge aggregators in every island", flush=True)
    lab = R.wan_lab(a.lab_id, f"{a.rate}bit", f"{a.wan_rate}bit", a.delay_scale,
                    hosts=a.hosts)
    try:
        res = R.run_schedules(lab, lnet, runs, train, guard_s=GUARD_S,
                              wan_guard_s=WAN_GUARD_S)
        gloo = {} if a.no_baselines else R.run_gloo(
            lab, [{"name": "gloo-ring-wan", "rounds": a.rounds}], train)
    finally:
        lab.down()
    colo = {}
    if not a.no_baselines:
        print(f"colocated lab {a.lab_id}: zero WAN delay, the same rates", flush=True)
        lab = R.wan_lab(a.lab_id, f"{a.rate}bit", f"{a.rate}bit", 0.0, edges=False,
                        hosts=a.hosts)
        try:
            colo = R.run_gloo(lab, [{"name": "colocated", "rounds": a.rounds}], train)
        finally:
            lab.down()
    return res, gloo, colo


def _row(r, s, res, a, P, R, lnet, opt, target) -> dict:
    """One run's figures (``s``: its summary)."""
    reps = res["replicators"][r["name"]]
    npk = -(-_params(a.hidden) // lnet.elements)
    row = {"name": r["name"], "schedule": r["label"], "kind": r["kind"],
           "memory_bytes": r["memory"], "edge_window": P.edge_window(r["memory"],
                                                                    lnet.elements),
           "chosen": r["label"] == opt[r["memory"]][0], "rounds_run": s["rounds"],
           "cycle": s["cycle"], "predicted_cycle_s": s["predicted_cycle_s"],
           "measured_cycle_s": s["measured_cycle_s"],
           "round_time_error": max(abs(x["ratio"] - 1) for x in s["cycle"]),
           "partial_datagrams": s["partial"], "missing_datagrams": s["missing"],
           "datagrams_per_update": npk, "host_sends_per_update": s["sent_per_update"],
           # the island updates the replicators took (K > 1: not the RESULTs they
           # fanned out to the hosts, counted apart)
           "replicator_rx": sum(x["rx"] - x.get("result_rx", 0) for x in reps),
           "replicator_copies": sum(x["copies"] for x in reps),
           "replicator_result_rx": sum(x.get("result_rx", 0) for x in reps),
           "replicator_result_copies": sum(x.get("result_copies", 0) for x in reps),
           "final_loss": s["loss"][-1],
           "wall_per_round_s": s["wall_s"][-1] / s["rounds"]}
    if "intra" in s:
        row["intra"] = s["intra"]
        row["wan_cycle"] = s["wan_cycle"]
        row["wan_round_time_error"] = max(abs(x["ratio"] - 1) for x in s["wan_cycle"])
        row["hosts_identical"] = s["hosts_identical"]
    if r["kind"] == "train" and target is not None:
        row["time_to_target_s"] = R.time_to_target(s, target)
    return row


def _figures(a, R, S, lnet, train, round_cost, mems, opt, wan_only, sums, rows, t_all,
             base, target, train_small) -> dict:
    """Everything ``wan.json`` holds."""
    fig = {"lab": {"topology": a.lab, "rate_bits": a.rate, "wan_rate_bits": a.wan_rate,
                   "delay_scale": a.delay_scale, "hosts_per_island": a.hosts,
                   "update_bytes": S, "elements": lnet.elements, "jitter_ms": a.jitter_ms,
                   "train": train, "rounds": a.rounds},
           "intra_round_cost_s": round_cost,
           "memory_sweep": [{"memory_bytes": m, "best": opt[m][0],
                             "best_wan_only": wan_only[m],
                             "measured_best": _measured_best(opt[m], sums, m),
                             "predicted": {lab_: P.cycle_with_round_cost(opt[m][1][lab_],
                                                                         round_cost)
                                           for lab_ in ("all-to-all", "cliques-3",
                                                        opt[m][0])},
                             "measured": {lab_: sums[f"{lab_}@{m:.0f}"]["measured_cycle_s"]
                                          for lab_ in ("all-to-all", "cliques-3", opt[m][0])}}
                            for m in mems],
           "rows": rows,
           "hosts_per_island": a.hosts,
           "round_time_error_max": max(r["round_time_error"] for r in rows
                                       if r["kind"] != "control"),
           "wall_s": time.monotonic() - t_all}
    if a.hosts > 1:
        sched = [r for r in rows if r["kind"] != "control"]
        fig["wan_round_time_error_max"] = max(r["wan_round_time_error"] for r in sched)
        fig["intra_ratio_max"] = max(r["intra"]["ratio"] for r in sched)
        fig["intra_partial_missing"] = sum(r["intra"]["partial"] + r["intra"]["missing"]
                                           for r in rows)
        fig["hosts_identical"] = all(r["hosts_identical"] for r in rows)
    if target is not None:
        ttt = {k: R.time_to_target(v, target) for k, v in base.items()}
        fig["target_loss"] = target
        fig["baselines"] = {k: {"time_to_target_s": ttt[k], "round_s_median":
                                float(np.median(v["round_s"])), "final_loss": v["loss"][-1]}
                            for k, v in base.items()}
        chosen = next(r for r in rows if r["name"] == train_small)
        fig["chosen_schedule"] = train_small
        fig["schedule_over_colocated"] = chosen["time_to_target_s"] / ttt["colocated"]
        fig["gloo_ring_over_schedule"] = ttt["gloo-ring-wan"] / chosen["time_to_target_s"]
        fig["by_memory"] = {r["name"]: {"schedule_over_colocated":
                                        r["time_to_target_s"] / ttt["colocated"],
                                        "gloo_ring_over_schedule":
                                        ttt["gloo-ring-wan"] / r["time_to_target_s"]}
                            for r in rows if r["kind"] == "train"}
    return fig


def _measured_best(opt_m, sums, m):
    """The optimizer's objective with each run's measured cycle in place of the predicted
    one (sigma2 is the schedule's own): which schedule the lab would have chosen, among
    those run at this M."""
    from ina_fabric.host.schedule.model import objective
    _, cands, _, net = opt_m
    best, val = None, -1.0
    for label in ("all-to-all", "cliques-3", opt_m[0]):
        s = sums.get(f"{label}@{m:.0f}")
        if s is None:
            continue
        v = objective(cands[label].sigma2, s["measured_cycle_s"], net.sigma_floor)
        if v > val:
            best, val = label, v
    return best


def _print(fig, rows):
    print(f"{'run':28s} {'rounds':>6s} {'pred ms':>8s} {'meas ms':>8s} {'err':>6s} "
          f"{'partial':>7s} {'missing':>7s} {'sends':>6s} {'copies':>7s} {'TTT s':>7s}")
    for r in rows:
        ctl = r["kind"] == "control"       # its prediction is not the rate it ran at
        print(f"{r['name']:28s} {r['rounds_run']:6d} "
              f"{'control' if ctl else format(r['predicted_cycle_s'] * 1e3, '.0f'):>8s} "
              f"{r['measured_cycle_s'] * 1e3:8.0f} "
              f"{'-' if ctl else format(r['round_time_error'], '.1%'):>6s} "
              f"{r['partial_datagrams']:7d} {r['missing_datagrams']:7d} "
              f"{r['replicator_rx']:6d} {r['replicator_copies']:7d} "
              f"{r.get('time_to_target_s', float('nan')):7.1f}")
    print(f"round time error max: {fig['round_time_error_max']:.1%}")
    if fig["hosts_per_island"] > 1:
        print(f"K = {fig['hosts_per_island']}: WAN step alone error max "
              f"{fig['wan_round_time_error_max']:.1%}; intra-island step measured/predicted "
              f"max {fig['intra_ratio_max']:.3f}; intra partial+missing "
              f"{fig['intra_partial_missing']}; hosts of an island identical: "
              f"{fig['hosts_identical']}")
    for fm in fig["memory_sweep"]:
        print(f"M = {fm['memory_bytes']:9.0f} B: optimizer's choice {fm['best']}"
              + (f" (WAN only: {fm['best_wan_only']})" if fig["hosts_per_island"] > 1
                 else "") + f", the lab's (measured cycles) {fm['measured_best']}")
    if "target_loss" in fig:
        for k, v in fig["baselines"].items():
            print(f"{k:28s} time to loss {fig['target_loss']:.3f}: "
                  f"{v['time_to_target_s']:.1f} s ({v['round_s_median'] * 1e3:.0f} ms/round)")
        print(f"schedule ({fig['chosen_schedule']}) / colocated: "
              f"{fig['schedule_over_colocated']:.2f}x; Gloo ring / schedule: "
              f"{fig['gloo_ring_over_schedule']:.2f}x")
        for k, v in fig["by_memory"].items():
            print(f"  {k:26s} / colocated {v['schedule_over_colocated']:.2f}x, Gloo ring / "
                  f"it {v['gloo_ring_over_schedule']:.2f}x")


def _plots(folder, fig, sums, base, opt, mems, topo, train_small, train_a2a, lnet,
           round_cost=0.0):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from ina_fabric.host.schedule.model import RoundModel
    from ina_fabric.host.wan import plan as P
    folder.mkdir(parents=True, exist_ok=True)
    f, ax = plt.subplots(figsize=(7, 4.2))
    lines = [("colocated (Gloo ring, no WAN delay)", base.get("colocated")),
             ("Gloo ring over the WAN", base.get("gloo-ring-wan")),
             (f"all-to-all ({train_a2a})", sums[train_a2a]),
             (f"chosen: {train_small}", sums[train_small])]
    for name, s in lines:
        if s is not None:
            ax.plot(s["wall_s"], s["loss"], marker=".", label=name)
    if "target_loss" in fig:
        ax.axhline(fig["target_loss"], color="gray", ls="--", lw=0.8, label="target")
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("training loss (mean over islands)")
    ax.set_title(f"wan9 lab: 9 islands x {fig['hosts_per_island']} host(s), "
                 "geographic delays")
    ax.legend(fontsize=8)
    f.tight_layout()
    tag = "wan" if fig["hosts_per_island"] == 1 else f"wan_k{fig['hosts_per_island']}"
    f.savefig(folder / f"{tag}_loss.png", dpi=110)
    plt.close(f)
    # the memory sweep: predicted (lines over a fine grid) and measured (markers)
    S, jit = fig["lab"]["update_bytes"], fig["lab"]["jitter_ms"] / 1e3
    grid = np.geomspace(min(mems) / 2, max(mems) * 2, 40)
    f, ax = plt.subplots(figsize=(7, 4.2))
    for label, color in (("all-to-all", "C0"), ("cliques-3", "C1")):
        sched = opt[mems[-1]][1][label].schedule
        ys = []
        for m in grid:
            net = P.net_config(lnet, S, m, jit)
            ys.append(RoundModel(topo, net).evaluate(sched)["t_cycle"] +
                      len(sched.rounds) * round_cost)
        ax.plot(grid, np.array(ys) * 1e3, color=color, label=f"{label}, predicted")
        ax.plot(mems, [fig_m["measured"][label] * 1e3 for fig_m in fig["memory_sweep"]],
                "o", color=color, label=f"{label}, measured")
    for fm in fig["memory_sweep"]:
        ax.annotate(f"best: {fm['best']}", (fm["memory_bytes"],
                                           fm["measured"][fm["best"]] * 1e3),
                    textcoords="offset points", xytext=(4, 8), fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("edge aggregator memory M (bytes)")
    ax.set_ylabel("cycle time (ms)")
    ax.set_title("memory sweep on the wan9 lab: measured vs the model")
    ax.legend(fontsize=8)
    f.tight_layout()
    f.savefig(folder / f"{tag}_sweep.png", dpi=110)
    plt.close(f)
    print(f"wrote {folder / f'{tag}_loss.png'} and {folder / f'{tag}_sweep.png'}")
