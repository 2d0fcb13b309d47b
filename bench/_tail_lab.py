"""``ina bench tail --lab rack``: bounded-time reductions against real Gloo on the lab's
links, under tails that the network and the compute produce.

One rack lab (``--workers`` training hosts h0.., two more hosts for background traffic),
and per *tail level*:

* background flows (``host.lab.traffic``) from the extra hosts into the training hosts'
  downlinks: real tbf queues that every protocol crossing those links meets;
* compute stragglers: before each step every rank sleeps a lognormal draw (median,
  P99/P50), seeded by (seed, step, rank): the same schedule on every backend.

Every backend trains the same workload for the same number of steps (no early stop, so
final accuracies compare at equal steps), one ``torchrun`` per host namespace; Gloo with a
timing hook, so its per-call allreduce time (bucket ready to sum in, as every backend's)
gives the measured P99/P50 of the level. Per (backend, level), one row: ``backend``,
``level``, ``gloo_p99_over_p50`` (measured in that level's Gloo run), ``p50_ms``/``p99_ms``
(this backend's allreduce calls on rank 0), ``bytes_per_step_per_link`` (tbf byte
counters of the training hosts' uplinks over the run, per step, mean over the hosts that
send no background flow, listed in ``bytes_hosts``),
``time_to_accuracy_s``, ``tta_speedup_vs_gloo``, ``final_accuracy``,
``dropped_fraction`` (mean per call), ``replicas_identical`` and ``lab: true``.
The flows start fresh with each run, so each backend meets the same on/off schedule from
its own start (torchrun's start-up, a few seconds, falls in it too).
"""

import json
import os
import pathlib
import subprocess
import tempfile
import time

import numpy as np

LAB_BACKENDS = {
    "gloo": "gloo",
    "tar-udp": "ina_fabric.host.collectives.plugin:tar_udp",
    "tar-udp-repair": "ina_fabric.host.collectives.plugin:tar_udp_repair",
    "tar-udp-hadamard": "ina_fabric.host.collectives.plugin:tar_udp_hadamard",
    "tar-tcp": "ina_fabric.host.collectives.plugin:tar_tcp",
    "ina": "ina",
    "ina-bounded": "ina-bounded",
    "ina-skip": "ina-skip",
    "ina-skip-carry": "ina-skip-carry",
}

def _uploads(kind, on_ms, off_ms, rate, senders=("w0", "w2"), stragglers=(0.0, 1.0)):
    """An "up-*" level: one on/off flow out of each sender's uplink, to the background
    hosts in turn (b0, b1, b0, ...), and stragglers (median ms, P99/P50)."""
    return {"flows": [(kind, w, f"b{i % 2}", on_ms, off_ms, rate)
                      for i, w in enumerate(senders)],
            "straggler_ms": stragglers[0], "straggler_ratio": stragglers[1]}


# Tail levels: background flows (kind, src, dst, on_ms, off_ms, udp rate) and stragglers
# (median ms, P99/P50). "b0", "b1" are the background hosts, "w0".. the training hosts.
# On our shared 2-core machines Gloo's P99/P50 is about 2.5 with no load at all (CPU
# contention between the ranks and other jobs); "mid" and "high" were chosen from
# gloo-only runs (`--lab-backends gloo --levels ...`): "stragglers" alone gave 5.0,
# "flows" alone 6.8-8.6 (digits, 100 Mbit, 150 steps).
LEVELS = {
    "none": {"flows": [], "straggler_ms": 0.0, "straggler_ratio": 1.0},
    "mid": {"flows": [("udp", "b0", "w0", 40, 60, "60mbit")],
            "straggler_ms": 2.0, "straggler_ratio": 3.0},
    "mild": {"flows": [("udp", "b0", "w0", 150, 350, "9mbit")],
             "straggler_ms": 0.0, "straggler_ratio": 1.0},
    "high": {"flows": [("tcp", "b0", "w0", 300, 700, None),
                       ("tcp", "b1", "w2", 300, 700, None)],
             "straggler_ms": 5.0, "straggler_ratio": 10.0},
    # "high" with the bulk TCP flows replaced by on/off UDP at 9 Mbit/s (for the 10 Mbit/s
    # lab: cross traffic that does not back off, like another job's UDP collective)
    "high-udp": {"flows": [("udp", "b0", "w0", 300, 700, "9mbit"),
                           ("udp", "b1", "w2", 300, 700, "9mbit")],
                 "straggler_ms": 5.0, "straggler_ratio": 10.0},
    "stragglers": {"flows": [], "straggler_ms": 5.0, "straggler_ratio": 20.0},
    # compute stragglers alone, sized for the 10 Mbit/s lab (a step's exchange ~180 ms):
    # median 20 ms, P99 600 ms, every rank its own draw per step
    "stragglers-heavy": {"flows": [], "straggler_ms": 20.0, "straggler_ratio": 30.0},
    # about 3: chosen from gloo-only scans on a quiet machine (100 Mbit/s, 150 steps, 2
    # repeats): UDP 90 Mbit/s 40/60 ms + stragglers median 3 ms, P99/P50 20 gave 3.06;
    # the same flow with median 4/P99/P50 12 gave 2.6, median 3/25 without it 4.7
    "mid-heavy": {"flows": [("udp", "b0", "w0", 40, 60, "90mbit")],
                  "straggler_ms": 3.0, "straggler_ratio": 20.0},
    # "mid-heavy" with the flow into w1's downlink instead of the measured rank 0's
    "mid-heavy-w1": {"flows": [("udp", "b0", "w1", 40, 60, "90mbit")],
                     "straggler_ms": 3.0, "straggler_ratio": 20.0},
    # "mid-heavy" with the flow in rank 0's *uplink* (a co-located tenant's upload from
    # h0): the tail is in a sender's contributions, the part a bound can cut, not in a
    # receiver's results, which every rank must get whole
    "up-heavy": _uploads("udp", 40, 60, "90mbit", senders=("w0",), stragglers=(3.0, 20.0)),
    # the same with two senders' uplinks loaded (h0 and h2), no stragglers
    "up-flows": _uploads("udp", 40, 60, "90mbit"),
    # candidates for an uplink level at about 3 (gloo-only scans, docs/tail.md run 27)
    "up-flows-long": _uploads("udp", 200, 300, "90mbit"),
    # `up-flows-long` for the 10 Mbit/s lab: UDP at 9 Mbit/s, the periods as they are and
    # scaled by the calls' length there (about 7.5x)
    "up-flows-10": _uploads("udp", 200, 300, "9mbit"),
    "up-flows-10-long": _uploads("udp", 1500, 2250, "9mbit"),
    "up-flows-all": _uploads("udp", 40, 60, "90mbit", senders=("w0", "w1", "w2", "w3")),
    "up-tcp": _uploads("tcp", 300, 700, None),
    # bulk TCP out of h0's and h2's uplinks, always on (issue 39: does TCP keep its
    # goodput beside the job? `ina bench cc`)
    "up-tcp-bulk": _uploads("tcp", 1000, 0, None),
    # "high" with the two bulk TCP flows leaving h0's and h2's uplinks instead of
    # entering their downlinks (co-located tenants uploading)
    "up-high": _uploads("tcp", 300, 700, None, stragglers=(5.0, 10.0)),
    # rare, long compute stragglers (100 Mbit/s lab): median 1 ms, P99 300 ms, every rank
    # its own draw per step. Most steps nobody is late; in about one step of six some
    # rank is late by 30 ms or more, and Gloo waits for it every time. A bound can cut
    # that wait; a rank still pays its own draws (the ceiling: docs/tail.md, run 27)
    "stragglers-rare": {"flows": [], "straggler_ms": 1.0, "straggler_ratio": 300.0},
    "flows": {"flows": [("tcp", "b0", "w0", 300, 700, None),
                        ("tcp", "b1", "w2", 300, 700, None)],
              "straggler_ms": 0.0, "straggler_ratio": 1.0},
}


def _host(name, workers):
    return f"h{int(name[1:])}" if name[0] == "w" else f"h{workers + int(name[1:])}"


def _flows(level, workers, seconds):
    from ina_fabric.host.lab.traffic import Flow
    out = []
    for kind, src, dst, on, off, rate in LEVELS[level]["flows"]:
        out.append(Flow(kind, _host(src, workers), _host(dst, workers), seconds=seconds,
                        on_ms=on, off_ms=off, rate=rate or "10mbit"))
    return out


def _take_log(logdir):
    """Rank 0's records from host TAR's log in ``logdir`` (calibration rounds left out),
    and the log removed. Called before each run too: a TAR run that timed out never read
    its log, and the next run, Gloo's, reported its 32% dropped as its own (run 31)."""
    p = pathlib.Path(logdir) / "rank0.json"
    if not p.exists():
        return []
    recs = [r for r in json.loads(p.read_text())["records"] if not r.get("calibrating")]
    p.unlink()
    return recs


def _quiet_hosts(flows, hosts):
    """The training hosts whose uplinks carry only the job: bytes per host link are read
    there. A host that also sends a background flow (the "up-*" levels) is left out;
    empty when every training host sends one (the row's bytes are then None)."""
    return [h for h in hosts if h not in {f.src for f in flows}]


def _uplink_bytes(lab, hosts):
    from ina_fabric.host.lab.status import link_counters
    c = link_counters(lab)
    return {h: c[h]["up"].get("bytes", 0) for h in hosts}


def _down_bytes(lab, hosts):
    """host -> bytes its downlink (the switch port's tbf queue) has sent."""
    from ina_fabric.host.lab.status import link_counters
    c = link_counters(lab)
    return {h: c[h]["down"].get("bytes", 0) for h in hosts}


def _link_drops(lab, hosts):
    """host -> (uplink drops, downlink drops): the tbf queues' drop counters."""
    from ina_fabric.host.lab.status import link_counters
    c = link_counters(lab)
    return {h: (c[h]["up"].get("drops", 0), c[h]["down"].get("drops", 0)) for h in hosts}


#: the switch's counters each row records (their change over the run): where a bounded
#: backend's time went (slots closed at the deadline, skipped, DATA answered late)
SWITCH_COUNTERS = ("accepted", "results", "partials", "skipped", "late", "duplicates",
                   "resent", "drop_stale", "drop_out_of_window")


def _switch_counters(lab, switch):
    """The running switch's counters (STATUS, asked from its own namespace), or {}."""
    import sys
    host, port = switch.rsplit(":", 1)
    probe = [sys.executable, "-c",
             "import json; from ina_fabric.protocol.control_client import query_status as q; "
             f"print(json.dumps(q(('{host}', {int(port)}), timeout=1.0)['counters']))"]
    try:
        r = lab.run(lab.topo.switches[0].name, probe, timeout=20)
        return json.loads(r.stdout) if r.returncode == 0 else {}
    except (OSError, ValueError, subprocess.SubprocessError):
        return {}


def _one(lab, backend, level, args, logdir, switch, elements, job=7):
    from ina_fabric.host.ddp.train import TrainConfig, run_training_lab
    from ina_fabric.host.lab import traffic
    lv = LEVELS[level]
    os.environ["INA_TAR_LOG"] = logdir
    os.environ["INA_TAR_ELEMENTS"] = str(elements)
    cfg = TrainConfig(workload=args.workload, workers=args.workers,
                      backend=LAB_BACKENDS[backend], seed=args.seed,
                      max_steps=args.steps, max_epochs=10_000, stop_at_target=False,
                      eval_every=args.eval_every, elements=elements, switch=switch,
                      deadline_ms=args.switch_deadline_ms, time_gloo=True,
                      deadline_rule=getattr(args, "slot_deadline_rule", "loss-aware"),
                      window=getattr(args, "window", 1024),
                      straggler_ms=lv["straggler_ms"],
                      straggler_p99_over_p50=lv["straggler_ratio"], job=job)
    hosts = lab.hosts[:args.workers]
    _take_log(logdir)        # a run that failed before reading its own log left it here
    flows = _flows(level, args.workers, args.flow_seconds)
    quiet = _quiet_hosts(flows, hosts)
    names = traffic.start(lab, flows)
    bg = lab.hosts[args.workers:]     # the background hosts: only the flows reach them
    try:
        b0, d0 = _uplink_bytes(lab, hosts), _link_drops(lab, hosts)
        g0, t0 = _down_bytes(lab, bg), time.monotonic()
        s0 = _switch_counters(lab, switch) if backend.startswith("ina") else {}
        res = run_training_lab(cfg, lab, timeout=args.flow_seconds)
        b1, d1 = _uplink_bytes(lab, hosts), _link_drops(lab, hosts)
        g1, t1 = _down_bytes(lab, bg), time.monotonic()
        s1 = _switch_counters(lab, switch) if s0 else {}
    finally:
        for n in names:
            lab.stop_service(n)
    recs = _take_log(logdir)
    calls = np.asarray(res.call_seconds[args.skip_calls:], float)
    if recs:
        dropped = float(np.mean([r.get("dropped_fraction", r.get("lost_fraction", 0.0))
                                 for r in recs]))
    elif backend.startswith(("ina-bounded", "ina-skip")) and res.stats.get("elements"):
        # the switch reports entries of partial results; at least one of N is missing
        dropped = res.stats["entries_lost"] / res.stats["elements"] / args.workers
    else:
        dropped = 0.0
    steps = max(res.steps, 1)
    return {
        "backend": backend, "level": level, "lab": True,
        "time_to_accuracy_s": res.time_to_accuracy,
        "final_accuracy": res.final_accuracy, "steps": res.steps,
        "seconds": res.seconds,
        # every rank's wall time: a bounded rank 0 may leave a slower rank behind
        "rank_seconds": list(res.rank_seconds),
        "p50_ms": 1e3 * float(np.median(calls)) if calls.size else None,
        "p99_ms": 1e3 * float(np.percentile(calls, 99)) if calls.size else None,
        "calls": int(calls.size),
        "bytes_per_step_per_link": (float(np.mean([b1[h] - b0[h] for h in quiet])) / steps
                                    if quiet else None),
        "bytes_hosts": quiet,
        "dropped_fraction": dropped,
        "replicas_identical": len(set(res.param_hashes)) == 1,
        "curve": [(t, acc) for t, _, _, acc in res.curve],
        "call_ms": [round(1e3 * c, 3) for c in res.call_seconds],
        # where the time went (issue 18, task 2): datagrams dropped in each training
        # host's tbf queues over the run (uplink: its own egress, background flows
        # included on downlinks), and rank 0's client counters (in-network backends)
        "drops_up": [d1[h][0] - d0[h][0] for h in hosts],
        "drops_down": [d1[h][1] - d0[h][1] for h in hosts],
        # what the background hosts received over the run (the flows' goodput: nothing
        # else goes to them) and how long the counters ran
        "bg_down_bytes": {h: g1[h] - g0[h] for h in bg}, "counter_seconds": t1 - t0,
        "uplink_bytes": {h: b1[h] - b0[h] for h in hosts},
        # the switch's counters over the run (in-network backends; {} if it did not answer)
        "switch": {k: s1.get(k, 0) - s0.get(k, 0) for k in SWITCH_COUNTERS} if s1 else {},
        "client": {k: res.stats[k] for k in ("packets_sent", "retransmits", "results",
                                             "duplicates_ignored", "partial_slots",
                                             "switch_deadline_ms", "agreed_rto_ms",
                                             "refetched", "refetched_results", "local_retries",
                                             "local_waits", "deadline_moves", "cwnd",
                                             "cwnd_cuts")
                   if k in (res.stats or {})},
    }


def run(args):
    from ina_fabric.host.lab import available, training_lab
    from ina_fabric.bench import _results
    why = available()
    if why:
        print(f"ina bench tail --lab: {why}")
        return 2
    levels = args.levels.split(",")
    backends = args.backends.split(",")
    bad = [x for x in levels if x not in LEVELS] + [b for b in backends
                                                     if b not in LAB_BACKENDS]
    if bad:
        print(f"ina bench tail --lab: unknown level or backend {bad[0]!r} (levels: "
              f"{', '.join(LEVELS)}; backends: {', '.join(LAB_BACKENDS)})")
        return 2
    if "gloo" not in backends:
        backends.insert(0, "gloo")
    sets = {"rate": args.rate, "queue_ms": args.queue_ms}
    t0 = time.time()
    pace = bool(getattr(args, "pace_switch", False))
    lab, switch, elements = training_lab(args.lab, args.workers + 2, sets, args.lab_id,
                                         pace_switch=pace)
    print(f"lab {lab.id}: {args.workers} training hosts + 2 background hosts at "
          f"{args.rate}, queue {args.queue_ms} ms, {elements} elements per datagram"
          + (", switch paced at the link rate" if pace else ""), flush=True)
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="ina-tail-lab-") as logdir:
            for level in levels:
                for rep in range(args.repeats):
                    for b in backends:
                        # a job id per run: the switch holds a job id for its session
                        # a while after the run (issue 17), so the next run takes another
                        try:
                            r = _one(lab, b, level, args, logdir, switch, elements,
                                     job=100 + len(rows))
                        except (RuntimeError, TimeoutError) as e:   # raised on its
                            # ranks (e.g. too late), or did not finish in --flow-seconds
                            r = _failed(b, level, e)    # a result, counted
                            r["repeat"] = rep
                            rows.append(r)
                            print(f"{level:5s} {b:16s} FAILED: {r['failed'][:300]}",
                                  flush=True)
                            continue
                        r["repeat"] = rep
                        rows.append(r)
                        _results.write(f"{args.name}_runs", json.loads(json.dumps(
                            {"runs": rows}, default=float)))   # so far, if it stops
                        print(f"{level:5s} {b:16s} tta "
                              f"{r['time_to_accuracy_s'] or float('nan'):6.2f} s  "
                              f"acc {r['final_accuracy']:.3f}  P50 {r['p50_ms'] or 0:6.1f} "
                              f"ms  P99 {r['p99_ms'] or 0:6.1f} ms  dropped "
                              f"{100 * r['dropped_fraction']:.2f}%  "
                              f"{(r['bytes_per_step_per_link'] or 0) / 1e3:.0f} kB/step/link"
                              f"  drops up {sum(r['drops_up'])} down {r['drops_down']}"
                              f"  slowest rank {max(r['rank_seconds'] or [0]):.2f} s"
                              + (f"  rank0 {r['client']}" if r["client"] else ""),
                              flush=True)
    finally:
        lab.down()
    table = summarize(rows, levels, backends)
    figs = {"config": {"lab": args.lab, "rate": args.rate, "queue_ms": args.queue_ms,
                       "workers": args.workers, "workload": args.workload,
                       "steps": args.steps, "eval_every": args.eval_every,
                       "seed": args.seed, "repeats": args.repeats,
                       "levels": {k: LEVELS[k] for k in levels},
                       "switch_deadline_ms": args.switch_deadline_ms,
                       "slot_deadline_rule": getattr(args, "slot_deadline_rule", "loss-aware"),
                       "window": getattr(args, "window", 1024),
                       "pace_switch": bool(getattr(args, "pace_switch", False)),
                       "elements": elements},
            "rows": table, "runs": rows, "seconds": time.time() - t0}
    if args.png:
        plot(rows, levels, backends, args.png)
    _results.write(args.name, json.loads(json.dumps(figs, default=float)))
    return 0


def _failed(backend, level, error) -> dict:
    """The row of a run that raised (every rank raises, e.g. AllreduceTooLate): no
    figures, the error."""
    return {"backend": backend, "level": level, "lab": True, "failed": str(error)[-600:],
            "time_to_accuracy_s": None, "final_accuracy": None, "steps": 0,
            "seconds": None, "p50_ms": None, "p99_ms": None, "calls": 0,
            "bytes_per_step_per_link": None, "dropped_fraction": None,
            "replicas_identical": None, "curve": [], "call_ms": []}


def summarize(rows, levels, backends):
    """One row per (backend, level): medians over repeats; ratios to Gloo's run of the
    same level and repeat."""
    out = []
    print(f"\n{'level':6s} {'backend':16s} {'gloo P99/P50':>12s} {'P50 ms':>7s} "
          f"{'P99 ms':>7s} {'kB/step/link':>12s} {'dropped':>8s} {'TTA s':>6s} "
          f"{'vs gloo':>8s} {'final acc':>9s} {'replicas':>9s}")
    for level in levels:
        gl = {r["repeat"]: r for r in rows if r["level"] == level and r["backend"] == "gloo"}
        ratio = [g["p99_ms"] / g["p50_ms"] for g in gl.values() if g["p50_ms"]]
        g_ratio = float(np.median(ratio)) if ratio else None
        for b in backends:
            rs = [r for r in rows if r["level"] == level and r["backend"] == b]
            sp = [gl[r["repeat"]]["time_to_accuracy_s"] / r["time_to_accuracy_s"]
                  for r in rs if r["time_to_accuracy_s"]
                  and gl[r["repeat"]]["time_to_accuracy_s"]]
            ttas = [r["time_to_accuracy_s"] for r in rs if r["time_to_accuracy_s"]]
            med = lambda k: float(np.median([r[k] for r in rs if r[k] is not None])) \
                if any(r[k] is not None for r in rs) else None
            row = {"backend": b, "level": level, "lab": True, "gloo_p99_over_p50": g_ratio,
                   "p50_ms": med("p50_ms"), "p99_ms": med("p99_ms"),
                   "bytes_per_step_per_link": med("bytes_per_step_per_link"),
                   "dropped_fraction": med("dropped_fraction"),
                   "time_to_accuracy_s": float(np.median(ttas)) if ttas else None,
                   "tta_speedup_vs_gloo": float(np.median(sp)) if sp else None,
                   "tta_speedup_min_max": [min(sp), max(sp)] if sp else None,
                   "final_accuracy": med("final_accuracy"),
                   "gloo_final_accuracy": float(np.median([g["final_accuracy"]
                                                           for g in gl.values()])),
                   "replicas_identical": all(r["replicas_identical"] for r in rs
                                             if not r.get("failed")),
                   "runs": len(rs), "failed_runs": sum(1 for r in rs if r.get("failed"))}
            out.append(row)
            f = lambda v, fmt: format(v, fmt) if v is not None else "-"
            print(f"{level:6s} {b:16s} {f(g_ratio, '12.2f')} {f(row['p50_ms'], '7.1f')} "
                  f"{f(row['p99_ms'], '7.1f')} "
                  f"{f(row['bytes_per_step_per_link'] and row['bytes_per_step_per_link'] / 1e3, '12.0f')} "
                  f"{100 * (row['dropped_fraction'] or 0):7.2f}% "
                  f"{f(row['time_to_accuracy_s'], '6.2f')} "
                  f"{f(row['tta_speedup_vs_gloo'], '7.2f')}x "
                  f"{f(row['final_accuracy'], '9.3f')} "
                  f"{'same' if row['replicas_identical'] else 'diverged':>9s}"
                  + (f"  ({row['failed_runs']} of {len(rs)} runs failed)"
                     if row["failed_runs"] else ""))
    return out


def plot(rows, levels, backends, path):
    """One panel per tail level: test accuracy against wall time, every backend."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(levels), figsize=(5 * len(levels), 4), squeeze=False)
    for ax, level in zip(axes[0], levels):
        g = [r for r in rows if r["level"] == level and r["backend"] == "gloo"]
        ratio = (g[0]["p99_ms"] / g[0]["p50_ms"]) if g and g[0]["p50_ms"] else float("nan")
        for b in backends:
            for r in rows:
                if r["level"] == level and r["backend"] == b and r["repeat"] == 0:
                    ax.plot([t for t, _ in r["curve"]], [a for _, a in r["curve"]],
                            ".-", label=b + (" (failed)" if r.get("failed") else ""))
        ax.set_title(f"tail {level}: Gloo allreduce P99/P50 = {ratio:.2f}")
        ax.set_xlabel("wall time (s)")
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")
