"""Time to accuracy through the switch at fixed wire precisions, on the lab.

    ina bench precision-tta                     digits, 4 hosts at 10 Mbit/s, int32/8/4,
                                                3 repetitions (about 10 minutes)
    ina bench precision-tta --widths 32,8,4 --reps 3 --rate 10mbit --epochs 20

Every run trains the same workload with its gradients summed in the lab's ``ina switch``
(``host.controller.switchpath.CompressedSwitchCollective``), the precision fixed for the whole run
and set as the wire's element width (the ``width`` byte): 32, 16 and 8 are the client's
own fixed point at that width (16 and 8 rounded stochastically), 4 the knob's int4 codes
on shared per-chunk scales, carried as int8 elements; the switch sums them as they are,
so the bytes on the wire shrink with the precision both ways. The widths are interleaved within each repetition
(its order rotated by one each repetition), so a machine that gets busier hurts all
alike, and repetition r uses seed r for every width (paired runs).

Per width: time to the workload's target accuracy (training seconds at the first
evaluation at or above it; evaluations every epoch) and final test accuracy after
``--epochs`` epochs, min / median / max over the repetitions; ``speedup_vs_int32``, the
median of the per-repetition ratios int32 time / this width's time; ``checked``: every
run of the width used the switch (no fallback) and ended with identical replicas.
Writes ``precision_tta.json`` (rows with ``width``, ``hosts``, ``rate_mbit``,
``workload``, ``tta_s``, ``speedup_vs_int32``, ``final_accuracy``,
``accuracy_delta_points``, ``checked``). Timings on a shared machine are noisy: the load
average is recorded with the figures.
"""

import argparse
from dataclasses import asdict
import json
import os
import sys
import time

import numpy as np


def main(argv=()):
    ap = argparse.ArgumentParser(prog="ina bench precision-tta",
                                 description=__doc__.strip().splitlines()[0])
    ap.add_argument("--widths", default="32,8,4",
                    help="precisions to compare, comma-separated, 32 among them "
                         "(of 32, 16, 8, 4)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions (>= 1), interleaved")
    ap.add_argument("--workload", default="digits", help="host.ddp.workloads name")
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--rate", default="10mbit", help="every host link, each way")
    ap.add_argument("--epochs", type=int, default=20, help="epochs per run")
    ap.add_argument("--lab-id", default="ptta", help="lab id (unique on this machine)")
    args = ap.parse_args(list(argv))
    from ina_fabric.host.controller.knobs import PRECISIONS
    try:
        widths = [int(w) for w in args.widths.split(",") if w.strip()]
    except ValueError:
        ap.error(f"--widths {args.widths!r}: integers, e.g. 32,8,4")
    if 32 not in widths or any(w not in PRECISIONS for w in widths):
        ap.error(f"--widths {args.widths!r}: each of {PRECISIONS}, 32 among them")
    if args.reps < 1 or args.epochs < 1 or args.hosts < 2:
        ap.error("--reps and --epochs must be >= 1, --hosts >= 2")
    from ina_fabric.host.lab import available, training_lab
    from ina_fabric.host.lab.topology import parse_rate
    why = available()
    if why:
        print(f"ina bench precision-tta: the lab is not available here: {why}",
              file=sys.stderr)
        return 2
    try:
        rate_bps = parse_rate(args.rate)
    except ValueError as e:
        ap.error(f"--rate: {e}")
    from ina_fabric.bench._results import write
    from ina_fabric.bench.experiments.realrun import ENV, RealSpec
    from ina_fabric.host.ddp.train import TrainConfig, run_training_lab
    lab, switch, elements = training_lab("rack", args.hosts, {"rate": args.rate, "mtu": 1500,
                                                              "queue_ms": 20.0},
                                         lab_id=args.lab_id)
    print(f"lab {lab.id}: {args.hosts} hosts at {args.rate}, switch {switch}, {elements} "
          f"elements per packet; {args.workload}, {args.epochs} epochs per run", flush=True)
    runs = {w: [] for w in widths}
    t_start = time.time()
    try:
        for rep in range(args.reps):
            order = widths[rep % len(widths):] + widths[:rep % len(widths)]
            for w in order:
                spec = RealSpec(controller="static", throttle=False, path="switch",
                                script=[(0, w, 1)], capacity=rate_bps / 8)
                os.environ[ENV] = json.dumps(asdict(spec))
                cfg = TrainConfig(workload=args.workload, workers=args.hosts, seed=rep,
                                  backend="ina_fabric.bench.experiments.realrun:collective",
                                  max_epochs=args.epochs, stop_at_target=False)
                t = time.time()
                try:
                    r = run_training_lab(cfg, lab, timeout=1200)
                finally:
                    os.environ.pop(ENV, None)
                ok = r.fallbacks == 0 and len(set(r.param_hashes)) == 1 and \
                    len(r.param_hashes) == args.hosts
                runs[w].append({"seed": rep, "tta_s": r.time_to_accuracy,
                                "final_accuracy": r.final_accuracy, "steps": r.steps,
                                "seconds": r.seconds, "bytes": r.stats.get("bytes"),
                                "checked": ok})
                tta = r.time_to_accuracy
                print(f"rep {rep} int{w:<2d}: time to {100 * _target(args.workload):.0f}% "
                      + (f"{tta:6.2f} s" if tta else "not reached")
                      + f", final accuracy {100 * r.final_accuracy:.2f}%, {r.steps} steps, "
                      f"{r.stats.get('bytes', 0) / max(r.steps, 1) / 1e3:.1f} KB per step,"
                      f" replicas {'identical' if ok else 'DIFFER or fell back'} "
                      f"[{time.time() - t:.0f} s wall]", flush=True)
    finally:
        lab.down()
    rows = _rows(runs, args)
    print(f"{'width':>6s} {'time to accuracy (s): min / median / max':>42s} "
          f"{'int32 / this':>12s} {'final acc (median)':>18s} {'checked':>8s}")
    for row in rows:
        t = row["tta_s"]
        print(f"{'int' + str(row['width']):>6s} "
              f"{_fmt(t['min'])} / {_fmt(t['median'])} / {_fmt(t['max']):>7s}".ljust(50)
              + f"{_fmt(row['speedup_vs_int32'], 'x'):>12s} "
              f"{100 * row['final_accuracy']['median']:17.2f}% {str(row['checked']):>8s}")
    narrow = [r for r in rows if r["width"] != 32 and r["speedup_vs_int32"]]
    best = max(narrow, key=lambda r: r["speedup_vs_int32"]) if narrow else None
    figs = {"workload": args.workload, "hosts": args.hosts, "rate_mbit": rate_bps / 1e6,
            "epochs": args.epochs, "reps": args.reps, "rows": rows, "runs":
            {str(w): v for w, v in runs.items()}, "wall_seconds": time.time() - t_start,
            "best_narrow_width": best["width"] if best else None,
            "best_speedup_vs_int32": best["speedup_vs_int32"] if best else None,
            "best_accuracy_delta_points": best["accuracy_delta_points"] if best else None}
    if best:
        print(f"headline: int{best['width']} reaches the target "
              f"{best['speedup_vs_int32']:.2f}x sooner than int32 through the switch "
              f"(median of {args.reps} paired repetitions); final accuracy "
              f"{best['accuracy_delta_points']:+.2f} points")
    write("precision_tta", figs)
    return 0


def _target(workload):
    from ina_fabric.host.ddp.workloads import get_workload
    return get_workload(workload, 0).target


def _fmt(v, unit=""):
    return "-" if v is None else f"{v:.2f}{unit}"


def _stats(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"min": None, "median": None, "max": None}
    return {"min": float(min(xs)), "median": float(np.median(xs)), "max": float(max(xs))}


def _rows(runs, args):
    """One row per width; the speedup is the median over repetitions of int32's time
    over this width's in the same repetition (the same seed)."""
    base = {r["seed"]: r for r in runs[32]}
    rows = []
    for w, rs in runs.items():
        ratios = [base[r["seed"]]["tta_s"] / r["tta_s"] for r in rs
                  if r["tta_s"] and base.get(r["seed"], {}).get("tta_s")]
        acc = _stats([r["final_accuracy"] for r in rs])
        acc32 = _stats([r["final_accuracy"] for r in runs[32]])
        rows.append({"width": w, "hosts": args.hosts, "rate_mbit": None,
                     "workload": args.workload, "tta_s": _stats([r["tta_s"] for r in rs]),
                     "reached": sum(1 for r in rs if r["tta_s"]), "reps": len(rs),
                     "speedup_vs_int32": float(np.median(ratios)) if ratios else None,
                     "per_rep_speedup": ratios, "final_accuracy": acc,
                     "accuracy_delta_points": 100 * (acc["median"] - acc32["median"]),
                     "bytes_per_step": float(np.median([r["bytes"] / max(r["steps"], 1)
                                                        for r in rs if r["bytes"]]))
                     if any(r["bytes"] for r in rs) else None,
                     "checked": all(r["checked"] for r in rs)})
    from ina_fabric.host.lab.topology import parse_rate
    for row in rows:
        row["rate_mbit"] = parse_rate(args.rate) / 1e6
    return rows


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
