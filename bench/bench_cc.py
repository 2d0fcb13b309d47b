"""Congestion control on the lab (issue 39): the training job beside uplink floods and
beside bulk TCP, against real Gloo on the same links, with the client's congestion
control on (``ina``) and off (``ina-off``, the fixed window of before).

One rack lab (4 training hosts, 2 background hosts), the tail-lab harness
(``bench/_tail_lab.py``: the same workload, steps, schedules and counters), and per
repetition, interleaved: the background flows alone for ``--alone-seconds`` (their
goodput with nothing else on the links), then every level with every backend. Per
(level, rate), one row of ``bench/results/cc.json``:

* ``tta_speedup_vs_gloo``: Gloo's time to the workload's target accuracy over ``ina``'s,
  same level and repetition; median over repetitions (``_off``: congestion control off);
* ``resent_fraction``: rank 0's re-sent datagrams over all it sent (``ina``);
* ``tcp_goodput_ratio`` (TCP levels): the TCP flows' goodput (bytes their receivers'
  downlinks carried, per second) beside ``ina`` over their goodput beside Gloo;
* ``jain`` (TCP levels): Jain's index over the job and the TCP flows, each normalized by
  what it gets alone (the job: its steps per second on quiet links, level ``none``, same
  backend and repetition; a flow: its goodput with no job), so 1.0 means each lost the
  same share to the others; ``gloo_jain`` is the same beside Gloo;
* ``checked``: every ``ina`` run finished, with identical replicas on every rank
  (``failed_runs``: the runs of each backend that did not finish).

The machine's CPUs are shared with other work (two cores, several engineers): the
load average is written with the figures, and the ratios move with it.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from ina_fabric.bench import _results

BACKENDS = {"gloo": ("gloo", None), "ina": ("ina", "aimd"), "ina-off": ("ina", "off")}


def jain(xs):
    xs = [x for x in xs if x is not None]
    if not xs or not any(xs):
        return None
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


def _alone(lab, level, args):
    """The level's background flows with no job: bytes/s each receiver got."""
    from ina_fabric.bench._tail_lab import _flows, _down_bytes
    from ina_fabric.host.lab import traffic
    flows = _flows(level, args.workers, args.alone_seconds + 10)
    if not flows:
        return {}
    bg = lab.hosts[args.workers:]
    names = traffic.start(lab, flows)
    try:
        time.sleep(1.0)                       # the connections are up
        g0, t0 = _down_bytes(lab, bg), time.monotonic()
        time.sleep(args.alone_seconds)
        g1, t1 = _down_bytes(lab, bg), time.monotonic()
    finally:
        for n in names:
            lab.stop_service(n)
    return {h: (g1[h] - g0[h]) / (t1 - t0) for h in bg}


def _run(lab, name, level, args, logdir, switch, elements, job):
    from ina_fabric.bench._tail_lab import _one, _failed
    backend, cc = BACKENDS[name]
    old = os.environ.get("INA_CONGESTION")
    if cc:
        os.environ["INA_CONGESTION"] = cc
    try:
        r = _one(lab, backend, level, args, logdir, switch, elements, job=job)
    except (RuntimeError, TimeoutError) as e:
        r = _failed(backend, level, e)
    finally:
        if old is None:
            os.environ.pop("INA_CONGESTION", None)
        else:
            os.environ["INA_CONGESTION"] = old
    r["backend"] = name
    c = r.get("client") or {}
    r["resent_fraction"] = (c["retransmits"] / c["packets_sent"]
                            if c.get("packets_sent") else None)
    secs = r.get("counter_seconds")
    r["bg_rate"] = ({h: b / secs for h, b in r["bg_down_bytes"].items()}
                    if secs and r.get("bg_down_bytes") else {})
    r["step_rate"] = r["steps"] / r["seconds"] if r.get("seconds") else None
    return r


def summarize(runs, alone, levels, backends, args):
    from ina_fabric.bench._tail_lab import LEVELS
    from ina_fabric.host.lab import parse_rate
    rate_mbit = parse_rate(args.rate) / 1e6
    rows = []
    med = lambda xs: statistics.median(xs) if xs else None          # noqa: E731
    span = lambda xs: [min(xs), max(xs)] if xs else None            # noqa: E731
    for level in levels:
        by = {(r["backend"], r["repeat"]): r for r in runs if r["level"] == level}
        none = {(r["backend"], r["repeat"]): r for r in runs if r["level"] == "none"}
        row = {"level": level, "rate_mbit": rate_mbit, "workload": args.workload,
               "mtu": args.mtu, "repeats": args.repeats}
        tcp = any(f[0] == "tcp" for f in LEVELS[level]["flows"])
        for name in backends:
            if name == "gloo":
                continue
            sfx = "" if name == "ina" else "_" + name.split("-", 1)[1]
            sp, rs, tg, jn = [], [], [], []
            for rep in range(args.repeats):
                r, g = by.get((name, rep)), by.get(("gloo", rep))
                if not r or not g or r.get("failed") or g.get("failed"):
                    continue
                if r["time_to_accuracy_s"] and g["time_to_accuracy_s"]:
                    sp.append(g["time_to_accuracy_s"] / r["time_to_accuracy_s"])
                if r["resent_fraction"] is not None:
                    rs.append(r["resent_fraction"])
                if tcp and r["bg_rate"] and g["bg_rate"] and sum(g["bg_rate"].values()):
                    tg.append(sum(r["bg_rate"].values()) / sum(g["bg_rate"].values()))
                a = alone.get((level, rep)) or {}
                q = none.get((name, rep))
                if tcp and a and r["bg_rate"] and q and q.get("step_rate") and r.get("step_rate"):
                    jn.append(jain([r["step_rate"] / q["step_rate"]] +
                                   [r["bg_rate"][h] / a[h] for h in a if a[h]]))
            row.update({f"tta_speedup_vs_gloo{sfx}": med(sp),
                        f"tta_speedup_min_max{sfx}": span(sp),
                        f"resent_fraction{sfx}": med(rs),
                        f"resent_fraction_min_max{sfx}": span(rs),
                        f"tcp_goodput_ratio{sfx}": med(tg),
                        f"tcp_goodput_ratio_min_max{sfx}": span(tg),
                        f"jain{sfx}": med(jn), f"jain_min_max{sfx}": span(jn)})
        gj = []
        for rep in range(args.repeats):
            g, q, a = by.get(("gloo", rep)), none.get(("gloo", rep)), alone.get((level, rep))
            if tcp and g and q and a and g.get("step_rate") and q.get("step_rate") \
                    and g["bg_rate"]:
                gj.append(jain([g["step_rate"] / q["step_rate"]] +
                               [g["bg_rate"][h] / a[h] for h in a if a[h]]))
        row["gloo_jain"] = med(gj)
        # checked: every run of congestion control as shipped (``ina``) finished with
        # identical replicas on every rank; the other backends' failures are counted
        rs = [r for r in by.values() if r["backend"] == "ina"]
        row["checked"] = bool(rs) and all(not r.get("failed") and r["replicas_identical"]
                                          for r in rs)
        row["failed_runs"] = {b: sum(1 for r in by.values() if r["backend"] == b
                                     and r.get("failed")) for b in backends}
        rows.append(row)
    return rows


def _show(row):
    f = lambda v, fmt: "-" if v is None else format(v, fmt)          # noqa: E731
    print(f"{row['level']:14s} {row['rate_mbit']:6.0f} Mbit/s  tta vs gloo "
          f"{f(row.get('tta_speedup_vs_gloo'), '.2f')}x (off "
          f"{f(row.get('tta_speedup_vs_gloo_off'), '.2f')}x)  re-sent "
          f"{f(row.get('resent_fraction') and 100 * row['resent_fraction'], '.2f')}% (off "
          f"{f(row.get('resent_fraction_off') and 100 * row['resent_fraction_off'], '.2f')}%)"
          f"  tcp goodput vs gloo {f(row.get('tcp_goodput_ratio'), '.2f')} (off "
          f"{f(row.get('tcp_goodput_ratio_off'), '.2f')})  jain {f(row.get('jain'), '.3f')} "
          f"(off {f(row.get('jain_off'), '.3f')}, gloo {f(row.get('gloo_jain'), '.3f')})  "
          f"{'checked' if row['checked'] else 'NOT CHECKED'}", flush=True)


def main(argv=()):
    ap = argparse.ArgumentParser(prog="ina bench cc", description=__doc__.strip(),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", default="up-flows-long,up-tcp-bulk,none",
                    help="tail levels of bench/_tail_lab.py (`none` is needed for jain)")
    ap.add_argument("--backends", default="gloo,ina,ina-off",
                    help=f"of {', '.join(BACKENDS)} (gloo is always run)")
    ap.add_argument("--rate", default="100mbit", help="host link rate")
    ap.add_argument("--queue-ms", type=float, default=20.0, help="tbf queue per link end")
    ap.add_argument("--mtu", type=int, default=9000,
                    help="every lab link's MTU (ina's datagrams are the most elements, a "
                         "power of two, that fit it; Gloo's TCP segments follow it too)")
    ap.add_argument("--workload", default="digits", help="training workload")
    ap.add_argument("--workers", type=int, default=4, help="training hosts")
    ap.add_argument("--steps", type=int, default=150, help="optimizer steps per run")
    ap.add_argument("--eval-every", type=int, default=5, help="steps between evaluations")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repetitions")
    ap.add_argument("--alone-seconds", type=float, default=10.0,
                    help="the flows alone, per repetition and level")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--flow-seconds", type=float, default=300.0,
                    help="each flow's life, and each training run's time limit")
    ap.add_argument("--window", type=int, default=1024, help="job window")
    ap.add_argument("--lab-id", default="cc", help="the lab's id")
    ap.add_argument("--name", default="cc", help="results file name (NAME.json)")
    ap.add_argument("--from-runs", metavar="JSON", default=None,
                    help="no lab: summarize the runs a stopped bench wrote "
                         "(bench/results/NAME_runs.json) into NAME.json")
    a = ap.parse_args(list(argv))
    from ina_fabric.bench._tail_lab import LEVELS
    from ina_fabric.host.lab import available, training_lab
    levels = [x.strip() for x in a.levels.split(",") if x.strip()]
    backends = [b.strip() for b in a.backends.split(",") if b.strip()]
    bad = [x for x in levels if x not in LEVELS] + [b for b in backends if b not in BACKENDS]
    if bad:
        print(f"ina bench cc: unknown level or backend {bad[0]!r} (levels: "
              f"{', '.join(LEVELS)}; backends: {', '.join(BACKENDS)})")
        return 2
    if "gloo" not in backends:
        backends.insert(0, "gloo")
    if a.from_runs:
        try:
            doc = json.loads(open(a.from_runs).read())["figures"]
        except (OSError, ValueError, KeyError) as e:
            print(f"ina bench cc: cannot read runs from {a.from_runs}: {e}")
            return 2
        runs = doc["runs"]
        alone = {tuple(k.rsplit("/", 1)[:1]) + (int(k.rsplit("/", 1)[1]),): v
                 for k, v in doc["alone"].items()}
        return _finish(runs, alone, levels, backends, a, time.time(), partial=True)
    why = available()
    if why:
        print(f"ina bench cc: skipped: {why}")
        return 0
    # what _one reads from the tail bench's flags
    a.switch_deadline_ms, a.skip_calls, a.slot_deadline_rule = None, 5, "loss-aware"
    t0 = time.time()
    lab, switch, elements = training_lab("rack", a.workers + 2,
                                         {"rate": a.rate, "queue_ms": a.queue_ms, "mtu": a.mtu},
                                         a.lab_id)
    print(f"lab {lab.id}: {a.workers} training hosts + 2 background hosts at {a.rate}, "
          f"queue {a.queue_ms} ms, MTU {a.mtu}, {elements} elements per datagram; load average "
          f"{os.getloadavg()[0]:.1f} (shared CPUs)", flush=True)
    runs, alone = [], {}
    try:
        with tempfile.TemporaryDirectory(prefix="ina-cc-") as logdir:
            for rep in range(a.repeats):
                for level in levels:
                    if LEVELS[level]["flows"]:
                        alone[(level, rep)] = _alone(lab, level, a)
                        print(f"rep {rep} {level}: flows alone {alone[(level, rep)]} B/s",
                              flush=True)
                    for name in backends:
                        r = _run(lab, name, level, a, logdir, switch, elements,
                                 job=100 + len(runs))
                        r["repeat"] = rep
                        runs.append(r)
                        print(f"rep {rep} {level:14s} {name:8s} "
                              + (f"FAILED {r['failed'][:200]}" if r.get("failed") else
                                 f"tta {r['time_to_accuracy_s'] or float('nan'):6.2f} s  "
                                 f"steps/s {r['step_rate'] or 0:5.2f}  re-sent "
                                 f"{100 * (r['resent_fraction'] or 0):5.2f}%  bg "
                                 f"{sum(r['bg_rate'].values()) * 8 / 1e6:6.1f} Mbit/s  "
                                 f"drops up {r['drops_up']}  rank0 {r['client']}"),
                              flush=True)
                        _results.write(f"{a.name}_runs", json.loads(json.dumps(
                            {"runs": runs, "alone": {f"{k[0]}/{k[1]}": v
                                                     for k, v in alone.items()}},
                            default=float)))
    finally:
        lab.down()
    return _finish(runs, alone, levels, backends, a, t0)


def _finish(runs, alone, levels, backends, a, t0, partial=False):
    a.repeats = max([r["repeat"] + 1 for r in runs] or [a.repeats])
    rows = summarize(runs, alone, levels, backends, a)
    for row in rows:
        _show(row)
    _results.write(a.name, json.loads(json.dumps({
        "rows": rows,
        "config": {k: v for k, v in vars(a).items()},
        "alone": {f"{k[0]}/{k[1]}": v for k, v in alone.items()},
        "runs": [{k: v for k, v in r.items() if k not in ("call_ms",)} for r in runs],
        "seconds": time.time() - t0, "from_partial_runs": partial,
        "note": "medians over interleaved repetitions; two CPU cores shared with other "
                "engineers' work (load average in this file): ratios move with it"},
        default=float)))
    return 0 if all(r["checked"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
