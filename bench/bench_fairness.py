"""Several jobs and several TCP flows on the same links (issue 39, "Fairness"): two
allreduce jobs, each with one rank on every training host, beside bulk TCP out of two of
those hosts, on the rack lab; Jain's index over the jobs and the flows, with ina and
with real Gloo (torch.distributed) as the jobs' backend.

Per repetition, interleaved, each phase ``--seconds`` long (every job's ranks start up
first, then all start at one moment, when the flows' counters are read): the TCP flows alone (their
goodput with nothing else on the links); then for each backend, one job alone (its
throughput on the same links with nothing else), then both jobs and both flows at once.
Each job's throughput is its bytes reduced per second (calls of ``--size`` float32
between its ranks' common start and its end), each flow's is the bytes its receiver's
downlink carried per second. Each share is normalized by what that job or flow got
alone, so 1.0 is no loss; Jain's index over the normalized shares is 1.0 when every job
and every flow lost the same fraction to the others. Rows of
``bench/results/fairness.json``, one per backend, each figure with min / median / max
over the repetitions:

* ``jain``: Jain's index over the two jobs and the two flows;
* ``job_share`` (per job) and ``tcp_share`` (per flow): the normalized shares;
* ``min_share``: the smallest of them;
* ``exact``: in every call of every job, every rank got the same bytes (ina: bitwise;
  the check is a hash of each rank's last result, gathered over the job's Gloo group).

The lab's CPUs are shared: 8 rank processes, a software switch and 4 flow endpoints on
two cores; the load average is written with the figures. Needs root.
"""

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

from ina_fabric.bench._ranks import gather, lab_rank
from ina_fabric.bench._results import write

BACKENDS = ("gloo", "ina")
#: the TCP level: one bulk connection out of h0 and out of h2, always on
LEVEL = "up-tcp-bulk"


def _worker(a):
    """One rank of one job in its host's namespace: allreduce calls of ``a.size`` float32
    for ``a.seconds`` after a barrier (at most ``a.max_calls``); rank 0 prints the count,
    the time and whether every rank's last result was the same bytes."""
    import numpy as np
    import torch
    import torch.distributed as dist
    state = lab_rank(a, 600) if a.backend == "ina" else None
    if state is None:
        from datetime import timedelta
        torch.set_num_threads(1)
        os.environ["GLOO_SOCKET_IFNAME"] = "eth0"
        dist.init_process_group("gloo", init_method=f"tcp://{a.master}", rank=a.rank,
                                world_size=a.world, timeout=timedelta(seconds=600))
    x = torch.randn(a.size, generator=torch.Generator().manual_seed(100 * a.job + a.rank))

    def call():
        if state is not None:
            z, _ = state.collective.allreduce(x.numpy())
            return np.asarray(z)
        y = x.clone()
        dist.all_reduce(y)
        return y.numpy()

    last = call()                                        # warm-up (untimed)
    dist.barrier()
    # every job starts at the same moment (CLOCK_MONOTONIC is the machine's, whatever the
    # namespace), when the bench starts reading the flows' counters
    late = time.monotonic() - a.start_at
    if late < 0:
        time.sleep(-late)
    t0 = max(time.monotonic(), a.start_at)
    calls = 0
    # the ranks stop together: each call carries, in its last element, 1 from a rank
    # whose time is not up, and the job goes on only while the sum is the world's. (Each
    # rank looking at its own clock raced: one rank began a call that its peers, a moment
    # later, did not, and waited for them until Gloo's timeout.)
    while calls < a.max_calls:
        x[-1] = 1.0 if time.monotonic() - a.start_at < a.seconds else 0.0
        last = call()
        calls += 1
        if last[-1] < a.world - 0.5:
            break
    took = time.monotonic() - t0
    # the job ends when its slowest rank does; every rank's last result the same bytes
    digest = hashlib.sha256(np.ascontiguousarray(last).tobytes()).hexdigest()
    seen = [None] * a.world
    dist.all_gather_object(seen, (calls, took, digest, late))
    if a.rank == 0:
        print(json.dumps({"calls": min(s[0] for s in seen),
                          "seconds": max(s[1] for s in seen),
                          "late_start_s": max(0.0, max(s[3] for s in seen)),
                          "same_calls": len({s[0] for s in seen}) == 1,
                          "identical": len({s[2] for s in seen}) == 1}), flush=True)
    if state is not None:
        state.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _start_job(lab, a, job, backend, start_at):
    """The ranks of one job, one per training host, as processes in the namespaces."""
    master = f"{lab.address('h0')}:{29500 + job}"
    env = {**os.environ, "INA_JOB": str(job)}
    procs = []
    for r, h in enumerate(lab.hosts[:a.workers]):
        argv = [sys.executable, "-m", "ina_fabric.bench.bench_fairness", "--worker",
                "--backend", backend, "--job", job, "--rank", r, "--world", a.workers,
                "--master", master, "--size", a.size, "--seconds", a.seconds,
                "--start-at", repr(start_at),
                "--max-calls", a.max_calls, "--elements", a.elements, "--window", a.window,
                "--inflight", a.inflight]
        procs.append(lab.popen(h, argv, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True))
    return procs


def _phase(lab, a, backend, jobs, flows):
    """``jobs`` jobs of ``backend`` (none: the flows alone) and ``flows`` bulk TCP flows at
    once: each job's bytes reduced per second, each flow's goodput (bytes/s)."""
    from ina_fabric.bench._tail_lab import _down_bytes, _flows
    from ina_fabric.host.lab import traffic
    bg = lab.hosts[a.workers:]
    names = traffic.start(lab, _flows(LEVEL, a.workers, a.startup + a.seconds + 30)) \
        if flows else []
    try:
        # the jobs' ranks start up (torch, Gloo, the switch) and wait for start_at; the
        # flows' goodput is read over the same seconds as the jobs' calls
        start_at = time.monotonic() + a.startup
        procs = {j: _start_job(lab, a, j, backend, start_at) for j in range(1, jobs + 1)}
        time.sleep(max(0.0, start_at - time.monotonic()))
        g0, t0 = _down_bytes(lab, bg), time.monotonic()
        time.sleep(max(0.0, start_at + a.seconds - time.monotonic()))
        g1, t1 = _down_bytes(lab, bg), time.monotonic()
        res = {j: gather(p, a.seconds + a.startup + 120,
                         [f"job {j} rank {r}" for r in range(a.workers)])
               for j, p in procs.items()}
    finally:
        for n in names:
            lab.stop_service(n)
    late = [r["late_start_s"] for r in res.values() if r["late_start_s"] > 0.5]
    if late:
        print(f"warning: a job started {max(late):.1f} s late (raise --startup)",
              file=sys.stderr, flush=True)
    nbytes = a.size * 4
    return ({j: {"rate": r["calls"] * nbytes / r["seconds"], "calls": r["calls"],
                 "seconds": r["seconds"], "late_start_s": r["late_start_s"],
                 "exact": r["identical"] and r["same_calls"]} for j, r in res.items()},
            {h: (g1[h] - g0[h]) / (t1 - t0) for h in bg} if flows else {})


def jain(xs):
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)) if xs and any(xs) else None


def _mmm(xs):
    xs = [x for x in xs if x is not None]
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)} if xs else None


def main(argv=()):
    ap = argparse.ArgumentParser(prog="ina bench fairness", description=__doc__.strip(),
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--workers", type=int, default=4, help="training hosts (a rank of "
                    "each job on each); the flows leave h0 and h2")
    ap.add_argument("--rate", default="100mbit", help="every link's rate")
    ap.add_argument("--queue-ms", type=float, default=20.0, help="tbf queue per link end")
    ap.add_argument("--mtu", type=int, default=9000)
    ap.add_argument("--size", type=int, default=1 << 20, help="float32 per call (4 MB)")
    ap.add_argument("--seconds", type=float, default=10.0, help="each phase's length")
    ap.add_argument("--startup", type=float, default=15.0,
                    help="seconds the ranks get to start before a phase begins")
    ap.add_argument("--max-calls", type=int, default=10_000, help="a job's calls at most")
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions")
    ap.add_argument("--backends", default="gloo,ina", help=f"of {', '.join(BACKENDS)}")
    ap.add_argument("--window", type=int, default=64, help="job window (slots)")
    ap.add_argument("--inflight", type=int, default=512 << 10,
                    help="bytes a worker keeps in flight at most")
    ap.add_argument("--id", default="fair", help="lab id")
    # the worker side (run by the bench inside each host's namespace)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--backend", help=argparse.SUPPRESS)
    ap.add_argument("--job", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--master", help=argparse.SUPPRESS)
    ap.add_argument("--start-at", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--elements", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args(list(argv))
    if a.worker:
        return _worker(a)
    backends = [b.strip() for b in a.backends.split(",") if b.strip()]
    bad = [b for b in backends if b not in BACKENDS]
    if bad or not backends:
        ap.error(f"--backends: {', '.join(bad) or 'none'}; have {', '.join(BACKENDS)}")
    if a.workers < 3 or a.workers > 14 or a.reps < 1 or a.seconds <= 0 or a.size < 1:
        ap.error("--workers in 3..14 (the flows leave h0 and h2), --reps >= 1, "
                 "--seconds > 0, --size >= 1")
    from ina_fabric.host.lab import Lab, available, load
    why = available()
    if why:
        print(f"fairness: skipped: {why}")
        return 0
    a.elements = 1 << ((a.mtu - 48) // 4).bit_length() - 1
    topo = load("rack", {"hosts": a.workers + 2, "rate": a.rate, "mtu": a.mtu,
                         "queue_ms": a.queue_ms})
    runs = []
    with Lab(topo, a.id) as lab:
        lab.start_switch()
        print(f"lab {a.id}: {a.workers} training hosts + 2 TCP receivers at {a.rate}, "
              f"2 jobs of {a.workers} ranks, {a.size * 4 / 2**20:g} MB calls, "
              f"{a.seconds:g} s a phase", flush=True)
        for rep in range(a.reps):
            _, alone = _phase(lab, a, None, 0, True)
            run = {"repeat": rep, "flows_alone": alone}
            for b in backends:
                solo, _ = _phase(lab, a, b, 1, False)
                both, flows = _phase(lab, a, b, 2, True)
                shares = [both[j]["rate"] / solo[1]["rate"] for j in sorted(both)]
                tcp = [flows[h] / alone[h] for h in sorted(alone) if alone[h]]
                run[b] = {"job_alone": solo[1], "jobs": both, "flows": flows,
                          "job_share": shares, "tcp_share": tcp, "jain": jain(shares + tcp),
                          "exact": all(j["exact"] for j in [*both.values(), solo[1]])}
                print(f"rep {rep} {b:5s} jobs {[round(s, 2) for s in shares]} tcp "
                      f"{[round(s, 2) for s in tcp]} jain {run[b]['jain']:.3f} "
                      f"exact {run[b]['exact']}", flush=True)
            runs.append(run)
    rows = []
    for b in backends:
        rs = [r[b] for r in runs]
        rows.append({"backend": b, "jobs": 2, "flows": 2, "rate_mbit": a.rate,
                     "jain": _mmm([r["jain"] for r in rs]),
                     "job_share": _mmm([s for r in rs for s in r["job_share"]]),
                     "tcp_share": _mmm([s for r in rs for s in r["tcp_share"]]),
                     "min_share": _mmm([min(r["job_share"] + r["tcp_share"]) for r in rs]),
                     "exact": all(r["exact"] for r in rs)})
        j = rows[-1]["jain"]
        print(f"{b:5s} jain median {j['median']:.3f} (min {j['min']:.3f}, max {j['max']:.3f})"
              f"; smallest share median {rows[-1]['min_share']['median']:.2f}; "
              f"exact {rows[-1]['exact']}", flush=True)
    write("fairness", {"rows": rows, "runs": runs, "reps": a.reps, "seconds": a.seconds,
                       "size_bytes": a.size * 4, "workers": a.workers,
                       "queue_ms": a.queue_ms, "mtu": a.mtu, "level": LEVEL})
    return 0 if all(r["exact"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
