"""Time-to-accuracy for in-network aggregation (reliable and bounded) against Gloo
allreduce, on the same seeds, in one run: digits CNN (or the transformer), 4 workers, on
loopback or, with --lab, on a lab's shaped links (one torchrun per host namespace).

Backends are interleaved seed by seed (gloo, ina, ina-bounded for seed 0, then seed 1,
...), so a machine that gets busier hurts all alike. Per backend: time to accuracy
min / median / max over the seeds, the median of the per-seed ratios to Gloo, final
accuracy, and whether the replicas were identical in every run. Writes
``train_<workload>.json`` (``train_<workload>_lab.json`` with --lab).
"""

import numpy as np

from ina_fabric.bench._results import write

BACKENDS = ("gloo", "ina", "ina-bounded")


def main(argv=()):
    import argparse
    ap = argparse.ArgumentParser(prog="ina bench train", description=__doc__.strip())
    ap.add_argument("--transformer", action="store_true",
                    help="the transformer workload instead of the digits CNN")
    ap.add_argument("--workers", type=int, default=4, help="ranks (hosts with --lab)")
    ap.add_argument("--seeds", type=int, default=1,
                    help="runs per backend, seeds 0 .. N-1, interleaved")
    ap.add_argument("--backends", default=",".join(BACKENDS),
                    help="comma-separated, of gloo, ina, ina-bounded")
    ap.add_argument("--lab", metavar="TOPOLOGY",
                    help="run on a lab built from TOPOLOGY (rack): one torchrun per host "
                         "namespace, every backend on the same links (root)")
    ap.add_argument("--lab-set", action="append", default=[], metavar="NAME=VALUE",
                    help="a lab topology parameter, e.g. rate=100mbit (repeatable)")
    ap.add_argument("--deadline-ms", type=float, default=20.0,
                    help="bounded mode's slot deadline")
    args = ap.parse_args(list(argv))
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(backends) - set(BACKENDS)
    if unknown or not backends:
        ap.error(f"--backends: unknown {', '.join(sorted(unknown)) or '(empty)'}")
    from ina_fabric.host.ddp.train import TrainConfig, run_training, run_training_lab
    workload = "transformer" if args.transformer else "digits"
    lab, switch, elements = None, None, None
    if args.lab:
        from ina_fabric.host.lab import available, training_lab, LabError, TopologyError
        why = available()
        if why:
            ap.error(f"--lab: {why}")
        sets = dict(kv.partition("=")[::2] for kv in args.lab_set)
        try:
            lab, switch, elements = training_lab(args.lab, args.workers, sets, "btrain")
        except (LabError, TopologyError, ValueError) as e:
            ap.error(f"--lab {args.lab}: {e}")
        print(f"lab {lab.id}: {lab.topo.name}, {args.workers} hosts, {elements} elements "
              f"per packet, switch {switch}", flush=True)
    runs = {b: [] for b in backends}
    try:
        for seed in range(args.seeds):
            for backend in backends:
                extra = {"elements": elements, "switch": switch} if lab else {}
                cfg = TrainConfig(workload=workload, backend=backend, workers=args.workers,
                                  deadline_ms=args.deadline_ms, seed=seed, **extra)
                r = run_training_lab(cfg, lab) if lab else run_training(cfg)
                runs[backend].append(r)
                tta = r.time_to_accuracy
                print(f"seed {seed} {backend:12s} time-to-accuracy "
                      f"{'%.2f s' % tta if tta else 'not reached'}  final acc "
                      f"{r.final_accuracy:.3f}  steps {r.steps}", flush=True)
    finally:
        if lab is not None:
            lab.down()
    figs = {"workload": workload, "workers": args.workers, "seeds": args.seeds,
            "lab": bool(lab), "lab_topology": args.lab, "lab_set": args.lab_set,
            "backends": {}}
    gloo = runs.get("gloo")
    print(f"{'backend':12s} {'time to accuracy (s): min / median / max':>42s} "
          f"{'vs gloo':>8s} {'final acc':>9s} {'replicas':>9s}")
    for name, rs in runs.items():
        tta = [r.time_to_accuracy for r in rs]
        reached = [t for t in tta if t]
        ratios = [r.time_to_accuracy / g.time_to_accuracy
                  for r, g in zip(rs, gloo or []) if r.time_to_accuracy and g.time_to_accuracy]
        same = all(len(set(r.param_hashes)) == 1 for r in rs)
        row = {"time_to_accuracy_s": tta, "final_accuracy": [r.final_accuracy for r in rs],
               "steps": [r.steps for r in rs], "replicas_identical": same,
               "stats": [r.stats for r in rs]}
        if reached:
            row.update(tta_min=min(reached), tta_median=float(np.median(reached)),
                       tta_max=max(reached))
        if ratios and gloo is not None:
            row["ratio_to_gloo_median"] = float(np.median(ratios))
            row["speedup_vs_gloo_median"] = float(np.median([1 / x for x in ratios]))
        figs["backends"][name] = row
        span = (f"{row['tta_min']:.2f} / {row['tta_median']:.2f} / {row['tta_max']:.2f}"
                if reached else "not reached")
        vs = f"{row['ratio_to_gloo_median']:.2f}x" if "ratio_to_gloo_median" in row else "-"
        print(f"{name:12s} {span:>42s} {vs:>8s} "
              f"{np.median(row['final_accuracy']):9.3f} "
              f"{'identical' if same else 'DIVERGED':>9s}")
    print("vs gloo: median over seeds of (time to accuracy / Gloo's on the same seed); "
          "below 1 is faster than Gloo")
    write(f"train_{workload}" + ("_lab" if lab else ""), figs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
