"""Allreduce on the rack lab: real Gloo (torch.distributed, one process per host
namespace, TCP through the bridge) against our switch (`ina switch` in the switch
namespace), on the same rate-limited links, interleaved; the ratio Gloo/ina per (hosts,
size), next to its limit 2(N-1)/N (bytes per host link: ring vs. one up, one down).
Needs root (network namespaces)."""

import argparse
import json
import statistics
import subprocess
import sys
import time

from ina_fabric.bench._ranks import gather, lab_rank
from ina_fabric.bench._results import write

SIZES = {"4MB": 4 << 20, "64MB": 64 << 20}


def limit(hosts: int) -> float:
    """Gloo's ring sends 2(N-1)/N of the buffer over each host link, ina sends it once."""
    return 2 * (hosts - 1) / hosts


def _worker(a):
    """One rank, in its host's namespace: Gloo and ina on the same data, interleaved."""
    import numpy as np
    import torch
    import torch.distributed as dist
    from ina_fabric.host.transport import quantize as Q
    state = lab_rank(a, 600)
    client = state.collective
    out = {}
    for name in a.sizes.split(","):
        n = SIZES[name] // 4
        x = torch.randn(n, generator=torch.Generator().manual_seed(1000 + a.rank))
        gmax = torch.tensor([float(x.abs().max())])
        dist.all_reduce(gmax, op=dist.ReduceOp.MAX)
        e = int(np.frexp(gmax.item())[1])
        # ina's bound from quantization, plus float32 rounding of Gloo's own float sum
        tol = Q.error_bound(e, a.world) + a.world * gmax.item() * 2.0 ** -22
        worst = 0.0

        def check(y_gloo, y_ina):
            nonlocal worst
            worst = max(worst, float(np.abs(y_ina - y_gloo.numpy()).max()) / tol)

        y = x.clone()
        dist.all_reduce(y)                      # warm-up, and the first check
        z, _ = client.allreduce(x.numpy())
        check(y, z)
        tg, ti = [], []
        for rep in range(a.reps):
            order = ("gloo", "ina") if rep % 2 == 0 else ("ina", "gloo")
            for which in order:
                dist.barrier()
                t = time.perf_counter()
                if which == "gloo":
                    y = x.clone()
                    dist.all_reduce(y)
                else:
                    z, _ = client.allreduce(x.numpy())
                dt = torch.tensor([time.perf_counter() - t])
                dist.all_reduce(dt, op=dist.ReduceOp.MAX)    # the slowest rank's time
                (tg if which == "gloo" else ti).append(dt.item())
            check(y, z)
        w = torch.tensor([worst])
        dist.all_reduce(w, op=dist.ReduceOp.MAX)
        out[name] = {"gloo_s": tg, "ina_s": ti, "worst_error_over_bound": w.item(),
                     "stats": client.total.as_dict()}
    if a.rank == 0:
        print(json.dumps(out), flush=True)
    state.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


def measure(hosts, rate, sizes, reps, mtu, elements, window, inflight, queue_ms, lab_id,
            timeout):
    from ina_fabric.host.lab import Lab, load
    topo = load("rack", {"hosts": hosts, "rate": rate, "mtu": mtu, "queue_ms": queue_ms})
    with Lab(topo, lab_id) as lab:
        lab.start_switch()
        master = f"{lab.address('h0')}:29500"
        procs = []
        for r, h in enumerate(lab.hosts):
            argv = [sys.executable, "-m", "ina_fabric.bench.bench_lab_allreduce", "--worker",
                    "--rank", r, "--world", hosts, "--master", master, "--sizes",
                    ",".join(sizes), "--reps", reps, "--elements", elements, "--window",
                    window, "--inflight", inflight]
            procs.append(lab.popen(h, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True))
        return gather(procs, timeout, list(range(hosts)))


def main(argv=()):
    ap = argparse.ArgumentParser(prog="ina bench lab-allreduce", description=__doc__.strip(),
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--hosts", default="4", help="comma-separated host counts (<= 16)")
    ap.add_argument("--rate", default="100mbit",
                    help="link rate (what this machine's CPUs can fill; see docs/lab.md)")
    ap.add_argument("--sizes", default="4MB,64MB", help=f"of {', '.join(SIZES)}")
    ap.add_argument("--reps", type=int, default=5, help="interleaved repetitions per size")
    ap.add_argument("--mtu", type=int, default=9000, help="lab link MTU (jumbo frames)")
    ap.add_argument("--elements", type=int, default=0,
                    help="int32 per packet (0: the most that fit the MTU, a power of two)")
    ap.add_argument("--window", type=int, default=64, help="job window (slots)")
    ap.add_argument("--inflight", type=int, default=512 << 10,
                    help="bytes a worker keeps in flight at most")
    ap.add_argument("--queue-ms", type=float, default=50.0, help="tbf queue per link end")
    ap.add_argument("--quick", action="store_true", help="4MB only, 3 repetitions")
    ap.add_argument("--id", default="bench", help="lab id")
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds per host count")
    # the worker side (run by the bench inside each host's namespace)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--master", help=argparse.SUPPRESS)
    a = ap.parse_args(list(argv))
    if a.worker:
        return _worker(a)
    from ina_fabric.host.lab import available, parse_rate
    why = available()
    if why:
        print(f"lab-allreduce: skipped: {why}")
        return 0
    sizes = ["4MB"] if a.quick else [s.strip() for s in a.sizes.split(",")]
    reps = 3 if a.quick else a.reps
    if a.elements <= 0:
        a.elements = 1 << ((a.mtu - 20 - 8 - 20) // 4).bit_length() - 1
    rate = parse_rate(a.rate)
    rows = []
    for hosts in (int(h) for h in a.hosts.split(",")):
        res = measure(hosts, a.rate, sizes, reps, a.mtu, a.elements, a.window, a.inflight,
                      a.queue_ms, a.id, a.timeout)
        for name in sizes:
            r = res[name]
            g, i = statistics.median(r["gloo_s"]), statistics.median(r["ina_s"])
            ok = r["worst_error_over_bound"] <= 1.0
            rows.append({"hosts": hosts, "size": SIZES[name], "size_name": name,
                         "rate_mbit": rate / 1e6, "gloo_ms_median": g * 1e3,
                         "ina_ms_median": i * 1e3, "gloo_over_ina_median": g / i,
                         "limit": limit(hosts), "checked": ok,
                         "worst_error_over_bound": r["worst_error_over_bound"],
                         "gloo_ms": [t * 1e3 for t in r["gloo_s"]],
                         "ina_ms": [t * 1e3 for t in r["ina_s"]],
                         "retransmits": r["stats"]["retransmits"],
                         # rank 0's sends its host's own queue refused, sent again
                         "local_retries": r["stats"].get("local_retries", 0),
                         # rank 0's sends that waited for its share of that
                         # queue to drain (sockbuf.local_queue_bytes)
                         "local_waits": r["stats"].get("local_waits", 0),
                         # rank 0's waits for a batch of RESULTs (window.COALESCE_*)
                         "coalesced_waits": r["stats"].get("coalesced_waits", 0),
                         "gloo_link_utilization": limit(hosts) * SIZES[name] * 8 / rate / g,
                         "ina_link_utilization": SIZES[name] * 8 / rate / i})
            print(f"{hosts} hosts {name:>5s} at {a.rate}: gloo {g * 1e3:8.1f} ms, ina "
                  f"{i * 1e3:8.1f} ms, gloo/ina = {g / i:4.2f} (limit {limit(hosts):.2f}); "
                  f"results {'within' if ok else 'OUTSIDE'} the bound", flush=True)
    write("lab_allreduce", {"rows": rows, "reps": reps, "mtu": a.mtu,
                            "elements": a.elements, "window": a.window,
                            "inflight": a.inflight, "queue_ms": a.queue_ms,
                            "note": "medians of interleaved repetitions (order alternates); "
                                    "each time is the slowest rank's; same links for both"})
    return 0 if all(r["checked"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
