"""WAN schedule optimizer: solve time (9 and 64 islands) against its target, the
memory sweep, simulator agreement, and time to a target loss against all-reduce.

    ina bench schedule                 figures to bench/results/schedule.json
    ina bench schedule --plot docs also regenerate docs/schedule_*.png
"""

import argparse
import pathlib
import sys
import time


from ina_fabric.bench import _results


def main(argv=None) -> int:
    from ina_fabric.host.schedule.topology import default_topology, synthetic_topology
    from ina_fabric.host.schedule.model import NetConfig, RoundModel
    from ina_fabric.host.schedule.search import optimize
    from ina_fabric.host.schedule.simulate import simulate_schedule
    from ina_fabric.bench.experiments.schedule import memory_sweep, training_comparison, DEFAULT_SWEEP
    from ina_fabric.host.schedule.train import IslandTrainConfig
    from ina_fabric.host.schedule.hwparams import default_memory
    from ina_fabric.host.schedule import plot

    ap = argparse.ArgumentParser(prog="ina bench schedule", description=__doc__.strip().splitlines()[0])
    ap.add_argument("--plot", "--png-dir", dest="png_dir", metavar="DIR",
                    help="write the figures (round map, sweep, training) here")
    ap.add_argument("--quick", action="store_true", help="fewer sweep points and rounds")
    args = ap.parse_args(argv)
    figures = {}
    topo9 = default_topology()
    m_default, window, note = default_memory()

    # -- solve time against the targets (10 s for 9 islands, 60 s for 64) --------------
    print("optimizer solve time (ratio = CPU seconds / target; < 1 meets it. CPU time, not "
          "wall: this machine is shared, and the search is single-threaded)")
    for n, target, topo in [(9, 10.0, topo9), (64, 60.0, synthetic_topology(64, seed=0))]:
        for mem in (2e6, 1e10):
            t0, c0 = time.perf_counter(), time.process_time()
            res = optimize(topo, NetConfig(memory_bytes=mem), seed=0, time_budget_s=5 * target)
            dt, cpu = time.perf_counter() - t0, time.process_time() - c0
            b = res.best
            lab = b.family if b.family != "cliques" else f"cliques-{b.k}"
            figures[f"solve_ratio_{n}_islands_M{mem:.0e}"] = cpu / target
            figures[f"solve_wall_over_cpu_{n}_islands_M{mem:.0e}"] = dt / cpu
            print(f"  {n:3d} islands, M={mem:8.0e}: {cpu / target:5.2f} of the {target:.0f} s "
                  f"target (wall/CPU {dt / cpu:4.1f}; {res.evaluated} schedules, "
                  f"{'exact R<=2' if res.exact else 'annealed'}); best {lab} x{len(b.schedule.rounds)}")

    # -- memory sweep --------------------------------------------------------------------
    mems = [1e4, 1e6, 1e8, 1e10] if args.quick else sorted(set(DEFAULT_SWEEP + [m_default]))
    net = NetConfig(update_bytes=1e9)
    print(f"memory sweep, 9 cities, S = 1 GB ({note}):")
    print(f"  {'M bytes':>9s} {'best':>13s} {'R':>2s} {'cycle/a2a@10G':>14s}")
    rows = memory_sweep(topo9, net, mems, seed=0)
    a2a_ref = min(r["t_cycle_s"] for r in rows if r["best"] == "all-to-all") \
        if any(r["best"] == "all-to-all" for r in rows) else rows[-1]["t_cycle_s"]
    for r in rows:
        print(f"  {r['memory_bytes']:9.3g} {r['best']:>13s} {r['rounds']:2d} "
              f"{r['t_cycle_s'] / a2a_ref:14.2f}")
        figures[f"sweep_best_M{r['memory_bytes']:.3g}"] = r["best"]
    small = [r["best"] for r in rows if 1e5 <= r["memory_bytes"] <= 3e7]
    large = [r["best"] for r in rows if r["memory_bytes"] >= 1e9]
    figures["sweep_small_M_is_cliques3"] = all(b == "cliques-3" for b in small)
    figures["sweep_large_M_is_all_to_all"] = all(b == "all-to-all" for b in large)
    print(f"  finding: small M -> cliques-3: {figures['sweep_small_M_is_cliques3']}; "
          f"large M -> all-to-all: {figures['sweep_large_M_is_all_to_all']}")

    # -- simulator agreement ---------------------------------------------------------------
    worst = 0.0
    for mem in (2e6, 1e8, 1e10):
        n2 = NetConfig(update_bytes=1e8, memory_bytes=mem)
        model = RoundModel(topo9, n2)
        b = optimize(topo9, n2, seed=0, model=model).best
        chunks = int(min(8192, max(512, 20 * n2.update_bytes / mem)))
        worst = max([worst] + [s.error for s in simulate_schedule(model, b.schedule, chunks)])
    figures["sim_vs_model_worst_error"] = worst
    print(f"simulator vs optimizer round times: worst error {100 * worst:.2f}% (target <= 10%)")

    # -- time to target loss ----------------------------------------------------------------
    cfg = IslandTrainConfig(rounds=60 if args.quick else 120)
    out = training_comparison(topo9, NetConfig(update_bytes=1e9, memory_bytes=1e8), cfg, seed=0)
    print(f"time to target loss {out['target_loss']:.4f} (9 cities, S = 1 GB, M = 100 MB, "
          f"compute {cfg.compute_s} s/round), ratio to colocated:")
    for r in out["rows"]:
        print(f"  {r['method']:58s} {r['gap_vs_colocated']:5.2f}x  "
              f"(comm/round / colocated comm/round "
              f"{r['comm_s_per_round'] / out['rows'][0]['comm_s_per_round']:5.2f})")
        figures[f"tta_gap::{r['method']}"] = r["gap_vs_colocated"]
    if args.png_dir:
        d = pathlib.Path(args.png_dir)
        d.mkdir(parents=True, exist_ok=True)
        best = optimize(topo9, NetConfig(memory_bytes=1e8), seed=0).best
        plot.plot_rounds(topo9, best, d / "schedule_rounds.png")
        plot.plot_sweep(rows, d / "schedule_sweep.png")
        plot.plot_training(out["traces"], out["target_loss"], d / "schedule_train.png")
        print(f"wrote {d}/schedule_rounds.png, schedule_sweep.png, schedule_train.png")
    _results.write("schedule", figures)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
