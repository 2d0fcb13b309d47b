"""Train a real model with N local workers, gradients aggregated through the software
switch (started here) or a switch you name, and the same run on Gloo as the baseline.

    ina train                                   digits CNN, 4 workers: ina vs Gloo
    ina train --backends ina,ina-bounded,gloo --loss 0.02 --plot tta.png
    ina train --workload transformer --max-epochs 3
    ina train --switch 192.168.1.50:19900        aggregate on an FPGA board

Under torchrun (multi-node), use host.ddp.hook.InaHookState.from_env in your script
(see README, "Train with torchrun").
"""

HELP = "train with aggregation offloaded to a switch, against Gloo on the same seeds"


def add_arguments(p):
    p.add_argument("--workload", default="digits", help="digits (default) or transformer")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--backends", default="ina,gloo",
                   help="comma-separated runs: ina, ina-bounded, gloo, or module:factory "
                        "(default: ina,gloo)")
    p.add_argument("--target", type=float, help="test accuracy to reach (default: the "
                   "workload's: 0.95 for digits)")
    p.add_argument("--max-epochs", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float)
    p.add_argument("--batch", type=int, help="per-worker batch")
    p.add_argument("--accum-steps", type=int, default=1)
    p.add_argument("--switch", metavar="IP:PORT", help="use this switch (FPGA or remote "
                   "`ina switch`) instead of starting one")
    p.add_argument("--static-job", action="store_true",
                   help="the switch already holds the job (an FPGA loaded with `ina "
                        "hw-config`): send no CONTROL, bind worker r to --worker-base-port + r")
    p.add_argument("--worker-base-port", type=int, default=0)
    p.add_argument("--elements", type=int, help="elements per packet (default: 8192 on "
                   "loopback, 256 with --switch, which fits a 1500-byte Ethernet MTU)")
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--deadline-ms", type=float, default=5.0, help="bounded-mode deadline")
    p.add_argument("--loss", type=float, default=0.0, help="injected uplink loss (ina runs)")
    p.add_argument("--duplicate", type=float, default=0.0)
    p.add_argument("--reorder", type=float, default=0.0)
    p.add_argument("--plot", metavar="PNG", help="write accuracy against wall time here")
    p.add_argument("--json", metavar="FILE", help="write all results as JSON here")
    p.add_argument("--no-progress", action="store_true")


def run(args):
    import json
    import sys
    from tqdm import tqdm
    from ..cli import CliError
    from ..ddp.train import TrainConfig, run_training
    runs = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not runs:
        raise CliError("--backends is empty")
    results = {}
    for backend in runs:
        cfg = TrainConfig(workload=args.workload, workers=args.workers, backend=backend,
                          target=args.target, max_epochs=args.max_epochs, seed=args.seed,
                          lr=args.lr, batch=args.batch, accum_steps=args.accum_steps,
                          switch=args.switch, window=args.window,
                          static_job=args.static_job, worker_base_port=args.worker_base_port,
                          elements=args.elements or (256 if args.switch else 8192),
                          deadline_ms=args.deadline_ms,
                          loss=args.loss if backend.startswith("ina") else 0.0,
                          duplicate=args.duplicate if backend.startswith("ina") else 0.0,
                          reorder=args.reorder if backend.startswith("ina") else 0.0)
        try:
            cfg.validate()
        except ValueError as e:
            raise CliError(str(e)) from None
        print(f"--- {backend}: {args.workload}, {args.workers} workers, seed {args.seed}"
              + (f", loss {cfg.loss:g}" if cfg.loss else ""), file=sys.stderr, flush=True)
        target = args.target or {"digits": 0.95, "transformer": 0.75}.get(args.workload)
        bar = tqdm(total=args.max_epochs, desc=f"{backend} (to acc {target:g})", unit="epoch",
                   file=sys.stderr,
                   disable=args.no_progress, dynamic_ncols=True)

        def progress(kind, payload, bar=bar):
            if kind == "eval":
                t, epoch, step, acc = payload
                bar.n = epoch
                bar.set_postfix(acc=f"{acc:.3f}", t=f"{t:.1f}s")
                bar.refresh()

        try:
            res = run_training(cfg, progress)
        except (RuntimeError, TimeoutError, ValueError) as e:
            bar.close()
            raise CliError(f"{backend} run failed: {e}") from None
        bar.close()
        results[backend] = res
    _report(results, args)
    if args.plot:
        _plot(results, args)
    if args.json:
        from dataclasses import asdict
        with open(args.json, "w") as fh:
            json.dump({k: {kk: vv for kk, vv in asdict(v).items() if kk != "params"}
                       for k, v in results.items()}, fh, indent=2, default=str)
    ok = all(r.time_to_accuracy is not None for r in results.values())
    return 0 if ok else 1


def _report(results, args):
    base = results.get("gloo")
    print()
    print(f"{'run':14s} {'time-to-acc':>12s} {'vs gloo':>8s} {'final acc':>9s} {'steps':>6s} "
          f"{'packets':>8s} {'retrans':>8s} {'partial':>8s} {'lost':>8s} {'replicas':>9s}")
    for name, r in results.items():
        tta = f"{r.time_to_accuracy:.1f}s" if r.time_to_accuracy is not None else "not reached"
        ratio = ""
        if base and base.time_to_accuracy and r.time_to_accuracy:
            ratio = f"{r.time_to_accuracy / base.time_to_accuracy:.2f}x"
        s = r.stats or {}
        same = "identical" if len(set(r.param_hashes)) == 1 else "DIVERGED"
        print(f"{name:14s} {tta:>12s} {ratio:>8s} {r.final_accuracy:9.3f} {r.steps:6d} "
              f"{s.get('packets_sent', '-'):>8} {s.get('retransmits', '-'):>8} "
              f"{s.get('partial_slots', '-'):>8} {s.get('entries_lost', '-'):>8} {same:>9s}")
        if r.fallbacks:
            print(f"  ({name}: the switch did not answer; {r.fallbacks} ranks fell back to Gloo)")
    print("time-to-acc: wall time from the first step to the first epoch whose test "
          "accuracy reached the target; stats are rank 0's (lost = entries that came from "
          "fewer than N workers)")


def _plot(results, args):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for name, r in results.items():
        if r.curve:
            t = [c[0] for c in r.curve]
            a = [c[3] for c in r.curve]
            ax.plot(t, a, marker=".", label=name)
    target = next(iter(results.values())).config.get("target")
    if target is None and args.workload == "digits":
        target = 0.95
    if target:
        ax.axhline(target, color="gray", ls="--", lw=0.8, label=f"target {target:g}")
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"{args.workload}, {args.workers} workers")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.plot, dpi=120)
    print(f"wrote {args.plot}")
