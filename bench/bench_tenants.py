"""Many tenants on one switch's memory (issue 39, docs/pool.md): 4 jobs of 4 workers share
a switch whose slot pool holds 2 jobs' windows, against the same 4 jobs on a switch with
unlimited memory.

Loopback, real sockets and processes: two `ina switch --engine fast` processes, the leaf
(``--pool-slots``, ``--parent``) and its parent (which sums what the pool cannot hold), and
one process per worker (``SwitchClient``, the compiled call loop), all jobs at once. A
job's *window memory* is what the switch gives a job without a pool: 2 x window slots;
``--memory-jobs 2`` makes the pool ``2 x 2 x window`` slots. Per repetition, interleaved:
the unlimited run (the same switches, no pool), then the pooled run, each job doing
``--calls`` timed allreduce calls of ``--size`` float32 after an untimed one. Figures
(``bench/results/tenants.json``), each with min/median/max over the repetitions:

* ``aggregate_over_unlimited``: the jobs' total bytes reduced per second, pooled over
  unlimited, same repetition;
* ``aggregate`` throughput: every job's bytes over the time from the common start (a
  barrier) to the last job's end;
* ``min_share``: the slowest job's throughput (its bytes over the time from the common
  start to its end) over its fair share, the mean of the jobs' throughputs in the same
  pooled run (the jobs ask for the same); ``jain_over_jobs`` is Jain's index over them;
* ``exact``: every rank of every job got bitwise the same result as the other ranks and
  as the unlimited run (integer sums at the switch: a pool must not change a bit), and
  within the quantization bound of the float64 sum;
* ``overflow_datagrams``: the leaf's ``overflow`` counter (DATA summed by the parent),
  and ``overflow_fraction`` of all DATA the leaf took;
* ``admitted``: every job installed on the pooled leaf (no memory refusal).

The machine's two cores are shared with other work: the load average is written with
the figures, and 18 processes on two cores measure the CPU as much as the pool.
"""

import argparse
import hashlib
import multiprocessing as mp
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from ina_fabric.bench import _results

INA = [sys.executable, "-m", "ina_fabric.host.cli"]


def _free_ports(n):
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def _inputs(job, worker, call, n):
    rng = np.random.default_rng([39, job, worker, call])
    return (rng.standard_normal(n) * rng.uniform(0.1, 10)).astype(np.float32)


def _worker(job, w, nworkers, leaf, port, session, window, elements, calls, size, barrier,
            q, congestion):
    try:
        from ina_fabric.host.transport.switch_client import SwitchClient
        from ina_fabric.host.transport import quantize as Q
        c = SwitchClient(switch=leaf, job=job, worker=w, nworkers=nworkers, window=window,
                         elements=elements, bind=("127.0.0.1", port), session=session,
                         connect_timeout=300.0, stall_timeout=300.0, start_wait=1.0,
                         congestion=congestion)
        # (a reliable first call waits for all the job's workers to start: with 16
        # processes on two loaded cores that is seconds, past the 2 s connect timeout)
        out = np.empty(size, np.float32)
        xs = [_inputs(job, w, k, size) for k in range(calls + 1)]
        c.allreduce(xs[0], out=out)              # untimed: numba, first window
        r0 = c.total.retransmits
        barrier.wait(timeout=600)
        t0 = time.perf_counter()
        digests = []
        for k in range(1, calls + 1):
            c.allreduce(xs[k], out=out)
            digests.append(hashlib.sha256(out.tobytes()).hexdigest()[:16])
        t1 = time.perf_counter()
        # the last call against the float64 sum of every worker's inputs
        xr = [_inputs(job, r, calls, size) for r in range(nworkers)]
        exact = sum(x.astype(np.float64) for x in xr)
        exps = np.max([Q.local_exponents(x, elements).astype(np.int16) for x in xr], axis=0)
        per_chunk = np.array([Q.error_bound(int(e), nworkers) for e in exps])
        bound = np.repeat(per_chunk, elements)[:size] + np.abs(exact) * 2.0 ** -23
        worst = float((np.abs(out - exact) / bound).max())
        q.put((job, w, t0, t1, digests, worst, c.total.retransmits - r0, None))
        c.close()
    except Exception as e:                       # reported, the run is not checked
        q.put((job, w, 0.0, 0.0, [], float("inf"), 0, f"{type(e).__name__}: {e}"))


def _start_switch(listen, cfg, key, extra):
    p = subprocess.Popen(INA + ["switch", "--listen", f"127.0.0.1:{listen}", "--config", cfg,
                                "--key-file", key, "--engine", "fast", *extra],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    from ina_fabric.host.switch import query_status
    from ina_fabric.protocol.keys import switch_key
    k = switch_key(path=key)
    for _ in range(400):
        if p.poll() is not None:
            raise RuntimeError(f"switch on {listen} exited: {p.stderr.read().strip()}")
        try:
            return p, query_status(("127.0.0.1", listen), timeout=0.2, key=k)
        except OSError:
            time.sleep(0.05)
    p.kill()
    raise RuntimeError(f"switch on {listen} did not answer")


def _status(port, key):
    from ina_fabric.host.switch import query_status
    from ina_fabric.protocol.keys import switch_key
    return query_status(("127.0.0.1", port), timeout=2.0, key=switch_key(path=key))


def run_once(a, pool, tmp):
    """One run of every job at once; pool: the leaf's pool slots (None: unlimited)."""
    leaf_port, parent_port = _free_ports(2)
    wports = _free_ports(a.jobs * a.workers)
    sessions = [secrets.randbits(63) | 1 for _ in range(a.jobs)]
    lines = []
    for j in range(a.jobs):
        ws = ", ".join(f'"127.0.0.1:{wports[j * a.workers + w]}"' for w in range(a.workers))
        lines += ["[[job]]", f"id = {j + 1}", f"workers = [{ws}]", f"window = {a.window}",
                  f"elements = {a.elements}", 'mode = "reliable"',
                  f'session = "0x{sessions[j]:016x}"']
    cfg = os.path.join(tmp, "jobs.toml")
    with open(cfg, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    key = os.path.join(tmp, "switch.key")
    procs = []
    try:
        p, _ = _start_switch(parent_port, cfg, key, [])
        procs.append(p)
        extra = ([] if pool is None else
                 ["--pool-slots", str(pool), "--parent", f"127.0.0.1:{parent_port}"])
        p, st = _start_switch(leaf_port, cfg, key, extra)
        procs.append(p)
        admitted = len(st["jobs"])
        ctx = mp.get_context("fork")     # (spawn re-imports numba in 16 processes)
        # (this process waits at the barrier too: the leaf's counters when the timed
        # calls start, so the overflow of the timed part is told apart from the untimed
        # first call's, where every client starts at its full window)
        barrier, q = ctx.Barrier(a.jobs * a.workers + 1), ctx.Queue()
        ws = [ctx.Process(target=_worker, args=(
            j + 1, w, a.workers, ("127.0.0.1", leaf_port), wports[j * a.workers + w],
            sessions[j], a.window, a.elements, a.calls, a.size, barrier, q, a.congestion))
            for j in range(a.jobs) for w in range(a.workers)]
        for w in ws:
            w.start()
        got, at_start = [], None
        try:
            barrier.wait(timeout=a.timeout)
            at_start = _status(leaf_port, key)["counters"]
            for _ in ws:
                got.append(q.get(timeout=a.timeout))
                if got[-1][7]:
                    raise RuntimeError(f"job {got[-1][0]} worker {got[-1][1]}: {got[-1][7]}")
        except Exception as e:
            for w in ws:
                w.kill()
            have = {(g[0], g[1]) for g in got}
            missing = [(j + 1, w) for j in range(a.jobs) for w in range(a.workers)
                       if (j + 1, w) not in have]
            raise RuntimeError(f"run with pool {pool}: {e or 'no report'} (within "
                               f"{a.timeout} s; no report from {missing}); leaf: "
                               f"{_status(leaf_port, key)}") from None
        for w in ws:
            w.join(timeout=30)
        leaf, parent = _status(leaf_port, key), _status(parent_port, key)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
    errors = [g[7] for g in got if g[7]]
    nbytes = a.calls * a.size * 4
    per_job, digests, worst = {}, {}, 0.0
    for job, w, t0, t1, dg, bad, _, _ in got:
        lo, hi = per_job.get(job, (float("inf"), 0.0))
        per_job[job] = (min(lo, t0), max(hi, t1))
        digests.setdefault(job, set()).add(tuple(dg))
        worst = max(worst, bad)
    # every worker leaves the barrier together: a job's throughput is its bytes over the
    # time from then to its last worker's end
    start = min(v[0] for v in per_job.values())
    end = max(v[1] for v in per_job.values())
    tput = {j: nbytes / (v[1] - start) for j, v in per_job.items() if v[1] > start}
    lc, pc = leaf["counters"], parent["counters"]
    return {"pool_slots": pool, "admitted": admitted, "errors": errors,
            "aggregate_bytes_per_s": (a.jobs * nbytes / (end - start)) if not errors else 0.0,
            "job_bytes_per_s": tput,
            "digests": {j: sorted(d) for j, d in digests.items()},
            "agree": all(len(d) == 1 for d in digests.values()) and not errors,
            "worst_over_bound": worst,
            "overflow": lc.get("overflow", 0), "leaf_rx_data": lc.get("rx_data", 0),
            "parent_overflow_in": pc.get("overflow_in", 0),
            "parent_results": pc.get("results", 0),
            "congested_results": lc.get("congested", 0),
            # the timed calls' part (from the barrier on)
            "overflow_timed": lc.get("overflow", 0) - at_start.get("overflow", 0),
            "leaf_rx_data_timed": lc.get("rx_data", 0) - at_start.get("rx_data", 0),
            "congested_timed": lc.get("congested", 0) - at_start.get("congested", 0),
            "retransmits_timed": sum(g[6] for g in got), "pool": leaf.get("pool"),
            "leaf_counters": {k: v for k, v in lc.items() if v},
            "parent_counters": {k: v for k, v in pc.items() if v}}


def _mmm(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"min": None, "median": None, "max": None}
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def main(argv=()):
    ap = argparse.ArgumentParser(prog="ina bench tenants", description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--workers", type=int, default=4, help="workers per job")
    ap.add_argument("--memory-jobs", type=float, default=2.0,
                    help="the pool holds this many jobs' window memory (2 x window slots "
                         "each; default 2)")
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--elements", type=int, default=256, help="elements per packet")
    ap.add_argument("--size", type=int, default=1 << 18, help="floats per call")
    ap.add_argument("--calls", type=int, default=8, help="timed calls per repetition")
    ap.add_argument("--congestion", choices=("aimd", "delay", "off"), default="aimd",
                    help="the clients' congestion control (aimd reacts to the switch's "
                         "CONGESTED flag, sent while the pool is full)")
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions (>= 3)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    ap.add_argument("--quick", action="store_true", help="small sizes, 1 repetition "
                    "(a smoke run, not the figures)")
    ap.add_argument("--name", default="tenants", help="results file name (NAME.json)")
    a = ap.parse_args(list(argv))
    if a.quick:
        a.size, a.calls, a.reps = 1 << 14, 2, 1
    if a.jobs < 1 or a.workers < 1 or a.reps < 1 or a.memory_jobs < 0:
        ap.error("--jobs, --workers, --reps must be >= 1, --memory-jobs >= 0")
    pool = int(a.memory_jobs * 2 * a.window)
    from ina_fabric.host.transport.switch_client import warm_up
    warm_up()            # the forked workers inherit the compiled kernels
    runs = []
    with tempfile.TemporaryDirectory(prefix="ina-tenants-39-") as tmp:
        with open(os.path.join(tmp, "switch.key"), "w") as fh:
            fh.write(secrets.token_hex(32) + "\n")
        os.chmod(os.path.join(tmp, "switch.key"), 0o600)
        for rep in range(a.reps):
            u = run_once(a, None, tmp)
            p = run_once(a, pool, tmp)
            runs.append((u, p))
            js = list(p["job_bytes_per_s"].values()) or [0.0]
            fair = sum(js) / len(js)
            print(f"rep {rep}: unlimited {u['aggregate_bytes_per_s'] / 1e6:.1f} MB/s, pooled "
                  f"{p['aggregate_bytes_per_s'] / 1e6:.1f} MB/s ({pool} slots), jobs "
                  + ", ".join(f"{v / 1e6:.1f}" for v in p["job_bytes_per_s"].values())
                  + f" MB/s (fair {fair / 1e6:.1f}), overflow {p['overflow']}/"
                  f"{p['leaf_rx_data']} (timed part {p['overflow_timed']}/"
                  f"{p['leaf_rx_data_timed']}), re-sent (timed) {u['retransmits_timed']} "
                  f"unlimited, {p['retransmits_timed']} pooled, "
                  f"exact {p['agree'] and u['agree']}"
                  + (f", errors {u['errors'] + p['errors']}" if u["errors"] or p["errors"]
                     else ""), flush=True)
    ratios, shares, exact, over, frac, jains = [], [], [], [], [], []
    for u, p in runs:
        ok = (u["agree"] and p["agree"] and u["digests"] == p["digests"]
              and max(u["worst_over_bound"], p["worst_over_bound"]) <= 1.0)
        exact.append(ok)
        if u["aggregate_bytes_per_s"] and p["aggregate_bytes_per_s"]:
            ratios.append(p["aggregate_bytes_per_s"] / u["aggregate_bytes_per_s"])
            js = list(p["job_bytes_per_s"].values())
            shares.append(min(js) / (sum(js) / len(js)))
            jains.append(sum(js) ** 2 / (len(js) * sum(x * x for x in js)))
        over.append(p["overflow"])
        frac.append(p["overflow"] / p["leaf_rx_data"] if p["leaf_rx_data"] else None)
    figures = {
        "jobs": a.jobs, "workers_per_job": a.workers, "memory_jobs": a.memory_jobs,
        "pool_slots": pool, "congestion": a.congestion, "window": a.window, "elements": a.elements,
        "size_floats": a.size, "calls": a.calls, "repetitions": a.reps,
        "setup": "loopback: two `ina switch --engine fast` processes (leaf with the pool, "
                 "its parent), one process per worker (SwitchClient, C loop)",
        "aggregate_over_unlimited": statistics.median(ratios) if ratios else None,
        "aggregate_over_unlimited_mmm": _mmm(ratios),
        "min_share": statistics.median(shares) if shares else None,
        "min_share_mmm": _mmm(shares),
        "jain_over_jobs_mmm": _mmm(jains),
        "exact": bool(exact) and all(exact),
        "admitted": all(p["admitted"] == a.jobs for _, p in runs),
        "overflow_datagrams": statistics.median(over),
        "overflow_datagrams_mmm": _mmm(over),
        "overflow_fraction_mmm": _mmm(frac),
        "overflow_timed_mmm": _mmm([p["overflow_timed"] for _, p in runs]),
        "overflow_timed_fraction_mmm": _mmm([p["overflow_timed"] / p["leaf_rx_data_timed"]
                                             for _, p in runs if p["leaf_rx_data_timed"]]),
        "retransmits_timed_mmm": {"unlimited": _mmm([u["retransmits_timed"] for u, _ in runs]),
                                  "pooled": _mmm([p["retransmits_timed"] for _, p in runs])},
        "congested_results_mmm": _mmm([p["congested_results"] for _, p in runs]),
        "parent_took_all": all(p["parent_overflow_in"] == p["overflow"] for _, p in runs),
        "runs": [{"unlimited": {k: v for k, v in u.items() if k != "digests"},
                  "pooled": {k: v for k, v in p.items() if k != "digests"}}
                 for u, p in runs],
    }
    _results.write(a.name, figures)
    print(f"aggregate/unlimited {figures['aggregate_over_unlimited_mmm']}, min share "
          f"{figures['min_share_mmm']}, exact {figures['exact']}, overflow "
          f"{figures['overflow_datagrams_mmm']}")
    return 0 if figures["exact"] and figures["admitted"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
