"""Tail latency: bounded TAR and in-network modes vs real Gloo; with --lab rack on a lab.

``--lab rack`` (the headline, see ``bench/_tail_lab.py``): real Gloo and the bounded
backends on the same rack links, tails from background flows and compute stragglers,
one row per (backend, tail level) in ``tail.json``. Without ``--lab`` (the older,
loopback figures with an emulated per-datagram tail; Gloo runs without it):

Three parts, all measured side by side in one run (ratios are the figures):

1. allreduce: per-call time of one bucket on 4 local ranks, for the ring (Gloo's
   algorithm over our impaired TCP), TAR over TCP, bounded TAR over UDP (adaptive
   deadline), in-network reliable and bounded (adaptive switch deadline), at each
   P99/P50; speedups are ring-time / time, and the fraction of entries lost per call.
2. time-to-accuracy (``host.ddp.train.run_training``, DDP with the comm hook): Gloo
   (real torch Gloo; our userspace impairment cannot reach its kernel TCP, so it runs
   without the tail: a conservative baseline), the ring under the tail, TAR over TCP,
   bounded TAR (plain: OptiReduce's local fill; ``-repair``: missed chunks fetched from
   their owners; ``-agree``: missed chunks zeroed on all ranks), in-network reliable and
   bounded; ratios to both Gloo and the ring.
3. loss tolerance: bounded TAR at a fixed generous deadline with 0-10% datagram loss,
   with and without the randomized Hadamard transform: final accuracy and TTA.

Default (`make bench`): allreduce at P99/P50 in {1.0, 3.0}, time-to-accuracy on digits at
P99/P50 = 3.0, loss in {0, 5%, 10%}: five to seven minutes on two busy cores.
``--full``: digits and transformer, P99/P50 in {1.0, 1.5, 3.0}, loss 0-10%.
``--plot FILE`` draws the figures (TTA ratios, loss sweep, deadline trajectory, loss/step).
"""

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

import numpy as np


MICRO_KINDS = ["ring-tcp", "tar-tcp", "tar-udp", "switch-reliable", "switch-bounded"]
TRAIN_BACKENDS = {"gloo": "gloo",
                  "ring-tcp": "ina_fabric.host.collectives.plugin:ring_tcp",
                  "tar-tcp": "ina_fabric.host.collectives.plugin:tar_tcp",
                  "tar-udp": "ina_fabric.host.collectives.plugin:tar_udp",
                  "tar-udp-repair": "ina_fabric.host.collectives.plugin:tar_udp_repair",
                  "tar-udp-agree": "ina_fabric.host.collectives.plugin:tar_udp_agree",
                  "switch-reliable": "ina_fabric.host.collectives.plugin:switch_reliable",
                  "switch-bounded": "ina_fabric.host.collectives.plugin:switch_bounded"}


def _micro_rank(rank, world, store, kind, n, calls, delay, ratio, elements, sw, seed):
    from ina_fabric.host.collectives import make_collective, SwitchTarget
    from ina_fabric.host.transport.impair import Impairment
    imp = Impairment(delay_median=delay, p99_over_p50=ratio, seed=seed * 100 + rank + 1)
    kw = dict(elements=elements)
    if kind.startswith("switch"):
        kw = dict(switch=SwitchTarget(sw[0], sw[1], job=seed + 1), elements=1024)
    c = make_collective(kind, rank, world, store, impairment=imp, calibration=5,
                        prefix=f"{kind}-{seed}", **kw)
    rows = []
    for i in range(calls):
        x = np.random.default_rng([rank, i]).standard_normal(n).astype(np.float32)
        _, st = c.allreduce(x)
        rows.append((st["seconds"], st.get("dropped_fraction", st["lost_fraction"]),
                     bool(st.get("calibrating"))))
    c.close()
    return rows


def micro(ratios, n, calls, delay, world, elements, rounds=2):
    """Each collective runs ``rounds`` times, interleaved (A B C .. A B C ..), so a change
    in the machine's load during the run falls on all of them alike."""
    from ina_fabric.host.cluster import run_ranks
    from ina_fabric.host.collectives.adapters import LiveSwitch
    from ina_fabric.host.transport.impair import Impairment
    out = {}
    seed = 0
    for ratio in ratios:
        down = Impairment(delay_median=delay, p99_over_p50=ratio, seed=999)
        secs = {k: [] for k in MICRO_KINDS}
        lost = {k: [] for k in MICRO_KINDS}
        with LiveSwitch(down) as sw:
            for _ in range(rounds):
                for kind in MICRO_KINDS:
                    seed += 1
                    R = run_ranks(world, _micro_rank, kind, n, calls, delay, ratio, elements,
                                  (sw.address, sw.control), seed)
                    calib = np.array([r[2] for r in R[0]])
                    secs[kind] += list(np.array([[r[i][0] for i in range(calls)]
                                                 for r in R]).max(0)[~calib])
                    lost[kind] += list(np.array([[r[i][1] for i in range(calls)]
                                                 for r in R]).mean(0)[~calib])
        for kind in MICRO_KINDS:
            out[f"{kind}@{ratio}"] = {"median_s": float(np.median(secs[kind])),
                                      "p99_s": float(np.percentile(secs[kind], 99)),
                                      "dropped_fraction": float(np.mean(lost[kind])),
                                      "calls": len(secs[kind])}
        ring = out[f"ring-tcp@{ratio}"]["median_s"]
        print(f"\nallreduce of {n} floats, {world} ranks, delay median {delay * 1e3:.1f} ms, "
              f"P99/P50 = {ratio}")
        print(f"{'collective':18s} {'speedup vs ring':>16s} {'P99 speedup':>12s} "
              f"{'dropped':>8s}")
        for kind in MICRO_KINDS:
            f = out[f"{kind}@{ratio}"]
            f["speedup_vs_ring"] = ring / f["median_s"]
            f["p99_speedup_vs_ring"] = out[f"ring-tcp@{ratio}"]["p99_s"] / f["p99_s"]
            print(f"{kind:18s} {f['speedup_vs_ring']:15.2f}x {f['p99_speedup_vs_ring']:11.2f}x "
                  f"{100 * f['dropped_fraction']:7.2f}%")
    return out


def _train(workload, backend, ratio, delay_ms, loss, seed, logdir, live, hadamard=False,
           deadline_ms=None, max_epochs=30, workers=4, stop=True):
    from ina_fabric.host.ddp.train import TrainConfig, run_training
    os.environ["INA_TAR_LOG"] = logdir
    os.environ["INA_LIVE_SWITCH"] = live
    if deadline_ms:
        os.environ["INA_TAR_DEADLINE_MS"] = str(deadline_ms)
    else:
        os.environ.pop("INA_TAR_DEADLINE_MS", None)
    b = TRAIN_BACKENDS[backend]
    if hadamard:
        b = "ina_fabric.host.collectives.plugin:tar_udp_hadamard"
    tail = backend != "gloo"
    cfg = TrainConfig(workload=workload, workers=workers, backend=b, seed=seed,
                      max_epochs=max_epochs, loss=loss,
                      delay_ms=delay_ms if tail else 0.0,
                      p99_over_p50=ratio if tail else 1.0, job=7, stop_at_target=stop)
    res = run_training(cfg)
    recs = []
    p = pathlib.Path(logdir) / "rank0.json"
    if p.exists():
        recs = json.loads(p.read_text())["records"]
        p.unlink()
    return {"tta_s": res.time_to_accuracy, "final_accuracy": res.final_accuracy,
            "seconds": res.seconds, "steps": res.steps,
            "replicas_identical": len(set(res.param_hashes)) == 1,
            "lost_fraction": float(np.mean([r.get("lost_fraction", 0) for r in recs]))
            if recs else 0.0,
            "dropped_fraction": float(np.mean([r.get("dropped_fraction", r.get("lost_fraction", 0))
                                               for r in recs])) if recs else 0.0,
            "records": recs}


def tta(workloads, ratios, backends, delay_ms, seed, logdir, live, max_epochs):
    out = {}
    for wl in workloads:
        for ratio in ratios:
            rows = {}
            for b in backends:
                r = _train(wl, b, ratio, delay_ms, 0.0, seed, logdir, live,
                           max_epochs=max_epochs)
                rows[b] = r
                out[f"{wl}/{b}@{ratio}"] = r
            g = rows.get("gloo", {}).get("tta_s")
            ring = rows.get("ring-tcp", {}).get("tta_s")
            print(f"\ntime-to-accuracy, {wl}, 4 workers, P99/P50 = {ratio} "
                  f"(delay median {delay_ms} ms; gloo without the tail)")
            print(f"{'backend':16s} {'speedup vs gloo':>16s} {'vs ring':>8s} {'final acc':>9s} "
                  f"{'dropped':>8s} {'inexact':>8s} {'replicas':>9s}")
            for b, r in rows.items():
                t = r["tta_s"]
                sg = (g / t) if (g and t) else float("nan")
                sr = (ring / t) if (ring and t) else float("nan")
                r["speedup_vs_gloo"], r["speedup_vs_ring"] = sg, sr
                print(f"{b:16s} {sg:15.2f}x {sr:7.2f}x {r['final_accuracy']:9.3f} "
                      f"{100 * r['dropped_fraction']:7.2f}% {100 * r['lost_fraction']:7.2f}% "
                      f"{'same' if r['replicas_identical'] else 'diverged':>9s}")
    return out


def loss_sweep(workload, losses, seed, logdir, live, deadline_ms, max_epochs):
    out = {}
    print(f"\nloss tolerance, {workload}, bounded TAR at a fixed {deadline_ms} ms deadline, "
          f"{max_epochs} epochs (final accuracy comparable across rows)")
    print(f"{'loss':>5s} {'hadamard':>8s} {'final acc':>9s} {'TTA vs 0%':>10s} {'dropped':>8s} "
          f"{'inexact':>8s}")
    base = None
    for loss in losses:
        for h in (False, True):
            r = _train(workload, "tar-udp", 1.0, 0.0, loss, seed, logdir, live, hadamard=h,
                       deadline_ms=deadline_ms, max_epochs=max_epochs, stop=False)
            out[f"{workload}/loss{loss}/{'hadamard' if h else 'plain'}"] = r
            if base is None and r["tta_s"]:
                base = r["tta_s"]
            rel = (base / r["tta_s"]) if (base and r["tta_s"]) else float("nan")
            r["tta_speedup_vs_lossless"] = rel
            print(f"{loss:5.2f} {'yes' if h else 'no':>8s} {r['final_accuracy']:9.3f} "
                  f"{rel:9.2f}x {100 * r['dropped_fraction']:7.2f}% "
                  f"{100 * r['lost_fraction']:7.2f}%")
    return out


def plot(figs, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(2, 2, figsize=(12, 8))
    tt = figs.get("tta", {})
    keys = sorted({k.split("@")[1] for k in tt}) if tt else []
    backs = [b for b in TRAIN_BACKENDS if any(k.split("/")[1].startswith(b + "@") for k in tt)]
    wls = sorted({k.split("/")[0] for k in tt})
    w = 0.8 / max(len(backs), 1)
    for i, b in enumerate(backs):
        xs, ys = [], []
        for j, (wl, r) in enumerate((wl, r) for wl in wls for r in keys):
            v = tt.get(f"{wl}/{b}@{r}", {}).get("speedup_vs_gloo")
            xs.append(j + i * w)
            ys.append(v if v == v and v is not None else 0)
        ax[0, 0].bar(xs, ys, w, label=b)
    ax[0, 0].set_xticks([j + 0.4 - w / 2 for j in range(len(wls) * len(keys))],
                        [f"{wl}\nP99/P50={r}" for wl in wls for r in keys])
    ax[0, 0].axhline(1.0, color="k", lw=0.5)
    ax[0, 0].set_ylabel("time-to-accuracy speedup vs Gloo")
    ax[0, 0].legend(fontsize=7)
    ls = figs.get("loss_sweep", {})
    for h in ("plain", "hadamard"):
        pts = sorted((float(k.split("/")[1][4:]), v["final_accuracy"]) for k, v in ls.items()
                     if k.endswith(h))
        if pts:
            ax[0, 1].plot(*zip(*pts), "o-", label=f"bounded TAR, {h}")
    ax[0, 1].set_xlabel("injected datagram loss")
    ax[0, 1].set_ylabel("final test accuracy")
    if ls:
        ax[0, 1].legend()
    for k, r in tt.items():
        recs = [x for x in r.get("records", []) if not x.get("calibrating")]
        if "tar-udp" in k and recs:
            ax[1, 0].plot([x["t"] for x in recs], [1e3 * x["scatter_deadline"] for x in recs],
                          label=f"{k} scatter")
            ax[1, 0].plot([x["t"] for x in recs], [1e3 * x["bcast_deadline"] for x in recs],
                          "--", label=f"{k} bcast")
        if "switch-bounded" in k and recs:
            ax[1, 0].plot([x["t"] for x in recs],
                          [1e3 * x.get("switch_deadline", 0) for x in recs], ":",
                          label=f"{k} switch slot")
        if ("bounded" in k or "udp" in k) and recs:
            ax[1, 1].plot(np.arange(len(recs)),
                          [100 * x.get("dropped_fraction", x["lost_fraction"]) for x in recs],
                          ".", ms=3, label=k)
    ax[1, 0].set_xlabel("seconds")
    ax[1, 0].set_yscale("log")
    ax[1, 0].set_ylabel("deadline (ms)")
    ax[1, 0].legend(fontsize=6)
    ax[1, 1].set_xlabel("allreduce call")
    ax[1, 1].set_ylabel("contributions dropped per call (%)")
    ax[1, 1].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="ina bench tail", description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="the full sweep (tens of minutes)")
    ap.add_argument("--parts", default="micro,tta,loss", help="micro,tta,loss")
    ap.add_argument("--delay-ms", type=float, default=5.0, help="median one-way delay")
    ap.add_argument("--bucket", type=int, default=1 << 18, help="floats per allreduce")
    ap.add_argument("--calls", type=int, default=16, help="calls per run (6 calibrate)")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved runs per collective")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", "--png", dest="png", default=None, metavar="PNG",
                    help="write the figures to this PNG")
    ap.add_argument("--backends", default=None,
                    help=f"comma-separated TTA backends from {','.join(TRAIN_BACKENDS)}")
    ap.add_argument("--workloads", default=None,
                    help="comma-separated (default: digits; --full: digits,transformer)")
    lab = ap.add_argument_group("on a lab (--lab rack): real Gloo beside the bounded "
                                "backends under background flows and stragglers")
    lab.add_argument("--lab", metavar="TOPOLOGY",
                     help="run on a lab built from TOPOLOGY (rack; root): the headline")
    from ._tail_lab import LEVELS, LAB_BACKENDS
    lab.add_argument("--levels", default="none,mid,mid-heavy,high",
                     help=f"tail levels, of {', '.join(LEVELS)} (default: %(default)s)")
    lab.add_argument("--lab-backends", dest="lab_backends",
                     default="gloo,tar-udp,tar-udp-repair,ina,ina-bounded,ina-skip",
                     help=f"backends on the lab, of {', '.join(LAB_BACKENDS)} "
                          "(default: %(default)s)")
    lab.add_argument("--workload", default="digits", help="digits, transformer, ...")
    lab.add_argument("--workers", type=int, default=4, help="training hosts")
    lab.add_argument("--steps", type=int, default=100, help="optimizer steps per run")
    lab.add_argument("--eval-every", type=int, default=5, help="steps between evaluations")
    lab.add_argument("--repeats", type=int, default=1,
                     help="runs per (backend, level), interleaved")
    lab.add_argument("--rate", default="100mbit", help="host link rate")
    lab.add_argument("--queue-ms", type=float, default=20.0, help="tbf queue per link end")
    lab.add_argument("--switch-deadline-ms", type=float, default=None,
                     help="ina-bounded: a fixed slot deadline (default: derived from the "
                          "link rate, the call window and the ranks' timeouts, "
                          "host/deadline.py)")
    lab.add_argument("--slot-deadline-rule", choices=("derived", "loss-aware"),
                     default="loss-aware",
                     help="the derived slot deadline's rule: derived (wire + 2 rto) or "
                          "loss-aware (wire + one more window while no RESULT is "
                          "re-fetched; host/deadline.py)")
    lab.add_argument("--pace-switch", action="store_true",
                     help="the switch sends each host its RESULTs no faster than the host "
                          "link (ina switch --pace-rate), so slots closing at once do not "
                          "overflow a downlink queue")
    lab.add_argument("--window", type=int, default=1024,
                     help="ina, ina-bounded: the job's window (the switch keeps 2 x window "
                          "results: a bounded worker may fall 2 x window - w datagrams "
                          "behind, w = its call's window, and still fetch a lost RESULT; "
                          "64 left 42 ms at 100 Mbit/s and failed the transformer's calls, "
                          "256 failed some of them under bulk TCP; 1024 leaves about 1.2 s)")
    lab.add_argument("--skip-calls", type=int, default=5,
                     help="allreduce calls left out of P50/P99 (warmup, calibration)")
    lab.add_argument("--flow-seconds", type=float, default=300.0,
                     help="background flows and each run stop after this long")
    lab.add_argument("--lab-id", default="tail", help="the lab's id")
    lab.add_argument("--name", default="tail", help="results file name (NAME.json)")
    args = ap.parse_args(argv)
    if args.lab:
        from ina_fabric.bench import _tail_lab
        args.backends = args.lab_backends
        return _tail_lab.run(args)
    from ina_fabric.bench import _results
    parts = set(args.parts.split(","))
    ratios = [1.0, 1.5, 3.0] if args.full else [1.0, 3.0]
    tta_ratios = ratios if args.full else [3.0]
    workloads = ["digits", "transformer"] if args.full else ["digits"]
    if args.workloads:
        workloads = args.workloads.split(",")
    losses = [0.0, 0.01, 0.02, 0.05, 0.10] if args.full else [0.0, 0.05, 0.10]
    backends = list(TRAIN_BACKENDS) if args.full else \
        ["gloo", "ring-tcp", "tar-tcp", "tar-udp", "tar-udp-repair", "switch-bounded"]
    if args.backends:
        backends = args.backends.split(",")
        bad = [b for b in backends if b not in TRAIN_BACKENDS]
        if bad:
            print(f"unknown backend {bad[0]!r}; have {', '.join(TRAIN_BACKENDS)}")
            return 2
    figs = {"config": {"delay_ms": args.delay_ms, "bucket": args.bucket, "full": args.full,
                       "ratios": ratios, "workloads": workloads, "losses": losses}}
    t0 = time.time()
    if "micro" in parts:
        figs["allreduce"] = micro(ratios, args.bucket, args.calls, args.delay_ms / 1e3, 4, 2048,
                                  args.rounds)
    from ina_fabric.host.collectives.adapters import LiveSwitch
    from ina_fabric.host.transport.impair import Impairment
    with tempfile.TemporaryDirectory(prefix="ina-tail-") as logdir:
        if "tta" in parts:
            figs["tta"] = {}
            for ratio in tta_ratios:
                down = Impairment(delay_median=args.delay_ms / 1e3, p99_over_p50=ratio,
                                  seed=998)
                with LiveSwitch(down) as sw:
                    live = f"{sw.address[0]}:{sw.address[1]},{sw.control[0]}:{sw.control[1]}"
                    figs["tta"].update(tta(workloads, [ratio], backends, args.delay_ms,
                                           args.seed, logdir, live,
                                           30 if args.full else 20))
        if "loss" in parts:
            figs["loss_sweep"] = loss_sweep("digits", losses, args.seed, logdir, "", 30.0,
                                            20 if args.full else 12)
    figs["seconds"] = time.time() - t0
    if args.png:
        plot(figs, args.png)
    slim = json.loads(json.dumps(figs, default=float))
    for r in slim.get("tta", {}).values():       # keep the trajectories short in the JSON
        r["records"] = r["records"][::max(1, len(r["records"]) // 200)]
    for r in slim.get("loss_sweep", {}).values():
        r.pop("records", None)
    _results.write("tail", slim)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
