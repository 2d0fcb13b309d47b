"""Time-to-accuracy for in-network aggregation (reliable and bounded) against Gloo
allreduce, on the same seeds, in one run: digits CNN, 4 workers, loopback."""

from ina_fabric.bench._results import write


def main(argv=()):
    import argparse
    ap = argparse.ArgumentParser(prog="ina bench train", description=__doc__.strip())
    ap.add_argument("--transformer", action="store_true",
                    help="the transformer workload instead of the digits CNN")
    args = ap.parse_args(list(argv))
    from ina_fabric.host.ddp.train import TrainConfig, run_training
    workload = "transformer" if args.transformer else "digits"
    runs = {}
    for backend in ("gloo", "ina", "ina-bounded"):
        r = run_training(TrainConfig(workload=workload, backend=backend, workers=4,
                                     deadline_ms=20.0))
        runs[backend] = r
        print(f"{backend:12s} time-to-accuracy {r.time_to_accuracy}  final acc "
              f"{r.final_accuracy:.3f}  steps {r.steps}", flush=True)
    base = runs["gloo"].time_to_accuracy
    figs = {}
    for name, r in runs.items():
        ratio = (r.time_to_accuracy / base) if (r.time_to_accuracy and base) else None
        figs[name] = {"time_to_accuracy_s": r.time_to_accuracy, "ratio_to_gloo": ratio,
                      "final_accuracy": r.final_accuracy, "steps": r.steps,
                      "stats": r.stats, "replicas_identical": len(set(r.param_hashes)) == 1}
        if ratio is not None:
            print(f"{name:12s} time-to-accuracy / gloo = {ratio:.2f}x")
    write(f"train_{workload}", figs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
