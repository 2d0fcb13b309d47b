"""Precision on the wire (issue 40): allreduce of one buffer through the switch at int32,
int16 and int8 on the rack lab (one rank per host namespace, the switch in its own, the
same rate-limited links), interleaved repetitions, beside real Gloo (torch.distributed)
on the same links; every result checked against the float64 sum and its width's bound
(docs/precision.md). Needs root (network namespaces); `--loopback` runs the same calls
on local processes and a local switch instead (no root, no rate limit: the CLI test)."""

import argparse
import json
import statistics
import subprocess
import sys
import time

from ina_fabric.bench._ranks import gather, lab_rank
from ina_fabric.bench._results import write

WIDTHS = (32, 16, 8)
#: targets of issue 40 (time at int32 / time at the width)
TARGETS = {8: 3.0, 16: 1.8}


def _inputs(rank: int, n: int):
    import numpy as np
    rng = np.random.default_rng([40, rank])
    return (rng.standard_normal(n) * rng.uniform(0.5, 2.0)).astype(np.float32)


def _check(y, world, n, elements, bits, rounding):
    """max over elements of |y - float64 sum| / (the width's bound + float32 rounding)."""
    import numpy as np
    from ina_fabric.host.transport import quantize as Q
    xs = [_inputs(r, n) for r in range(world)]
    exact = np.zeros(n)
    absum = np.zeros(n)
    for x in xs:
        exact += x
        absum += np.abs(x)
    bound = Q.error_bounds(xs, elements, bits, rounding == "stochastic") + absum * 2.0 ** -23
    return float((np.abs(y.astype(np.float64) - exact) / bound).max())


def _rank(rank, world, client, size, reps, rounding, gloo, timer, allmax):
    """One rank's calls: per repetition every width (and Gloo), in an order that rotates,
    each timed as the slowest rank's; the results checked (rank 0) and compared across
    ranks by digest (every rank must hold the same bytes)."""
    import hashlib
    import numpy as np
    n = size // 4
    x = _inputs(rank, n)
    names = [f"int{b}" for b in WIDTHS] + (["gloo"] if gloo else [])
    times = {k: [] for k in names}
    worst = {k: 0.0 for k in names}
    digests_ok = True
    # warm-up: one call of each width (the first call of a run pays for the window's
    # start); checked like the others
    order = list(names)
    for rep in range(-1, reps):
        if rep >= 0:
            k = rep % len(order)
            order = names[k:] + names[:k]
        for name in order:
            if name == "gloo":
                y, dt = timer(lambda: gloo(x))
            else:
                bits = int(name[3:])
                (y, _), dt = timer(lambda: client.allreduce(
                    x, precision=f"{bits}:{rounding}" if rounding != "nearest" else bits))
            if rep >= 0:
                times[name].append(allmax(dt))
            digest = int.from_bytes(hashlib.sha256(np.asarray(y).tobytes()).digest()[:6],
                                    "big")
            if name != "gloo":
                digests_ok &= allmax(digest) == -allmax(-digest)     # max == min
                if rank == 0:
                    worst[name] = max(worst[name], _check(
                        np.asarray(y), world, n, client.elements, bits, rounding))
    return {"times": times, "worst": worst, "identical": bool(digests_ok)}


def _lab_worker(a):
    """One rank in its host's namespace: Gloo for the barrier, the timing maxima and the
    Gloo row; the switch for the widths."""
    import torch
    import torch.distributed as dist
    state = lab_rank(a, 900)
    client = state.collective

    def timer(fn):
        dist.barrier()
        t = time.perf_counter()
        out = fn()
        return out, time.perf_counter() - t

    def allmax(v):
        t = torch.tensor([float(v)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    def gloo(x):
        y = torch.from_numpy(x.copy())
        dist.all_reduce(y)
        return y.numpy()

    out = _rank(a.rank, a.world, client, a.size, a.reps, a.rounding,
                gloo if a.gloo else None, timer, allmax)
    if a.rank == 0:
        print(json.dumps(out), flush=True)
    state.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _lab(hosts, rate, a):
    from ina_fabric.host.lab import Lab, load
    topo = load("rack", {"hosts": hosts, "rate": rate, "mtu": a.mtu, "queue_ms": a.queue_ms})
    with Lab(topo, a.id) as lab:
        lab.start_switch()
        master = f"{lab.address('h0')}:29500"
        procs = []
        for r, h in enumerate(lab.hosts):
            argv = [sys.executable, "-m", "ina_fabric.bench.bench_precision", "--worker",
                    "--rank", r, "--world", hosts, "--master", master, "--size", a.size,
                    "--reps", a.reps, "--elements", a.elements, "--window", a.window,
                    "--inflight", a.inflight, "--rounding", a.rounding] + (
                        ["--no-gloo"] if not a.gloo else [])
            procs.append(lab.popen(h, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True))
        return gather(procs, a.timeout, lab.hosts)


def _loopback(hosts, a):
    """The same calls on ``hosts`` local clients (threads: the C loop releases the GIL)
    against a local compiled switch; no Gloo row. For the CLI's test."""
    import threading
    from ina_fabric.host.switch import SwitchServer
    from ina_fabric.host.transport import SwitchClient
    from ina_fabric.host.cluster import free_udp_ports
    from ina_fabric.protocol.jobtable import JobConfig
    ports = free_udp_ports(hosts)
    job = JobConfig(1, tuple(f"127.0.0.1:{p}" for p in ports), window=a.window,
                    elements=a.elements)
    server = SwitchServer([job], "127.0.0.1", 0, key=None)
    st = threading.Thread(target=server.serve_forever, args=(False,), daemon=True)
    st.start()
    barrier = threading.Barrier(hosts)
    slots = [0.0] * hosts
    lock = threading.Lock()
    results, errors = [None] * hosts, []

    def run(w):
        def timer(fn):
            barrier.wait(60)
            t = time.perf_counter()
            out = fn()
            return out, time.perf_counter() - t

        def allmax(v):
            slots[w] = float(v)
            barrier.wait(60)
            m = max(slots)
            barrier.wait(60)
            return m
        try:
            with SwitchClient(server.address, 1, w, hosts, a.window, a.elements,
                              bind=("127.0.0.1", ports[w]), session=job.session) as c:
                results[w] = _rank(w, hosts, c, a.size, a.reps, a.rounding, None, timer,
                                   allmax)
        except Exception as e:  # noqa: BLE001 (reported below)
            with lock:
                errors.append(f"rank {w}: {type(e).__name__}: {e}")
            barrier.abort()
    ts = [threading.Thread(target=run, args=(w,)) for w in range(hosts)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(a.timeout)
    server.stop()
    st.join(2)
    server.close()
    if errors:
        raise RuntimeError("; ".join(errors))
    return results[0]


def _size(text) -> int:
    """Bytes from ``65536``, ``256K``, ``64M``, ``64MB``, ``1G`` (powers of 1024)."""
    t = str(text).strip().upper().removesuffix("IB").removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    num = t[:-1] if mult > 1 else t
    if not num.isdigit():
        raise ValueError(f"bad size {text!r}: use bytes, e.g. 65536, 256K or 64M (K, M, G "
                         f"are powers of 1024)")
    return int(num) * mult


def _stats(v):
    return {"min": min(v), "median": statistics.median(v), "max": max(v)}


def main(argv=()):
    ap = argparse.ArgumentParser(prog="ina bench precision", description=__doc__.strip(),
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--hosts", default="4", help="comma-separated host counts (<= 16)")
    ap.add_argument("--rate", default="100mbit", help="comma-separated link rates")
    ap.add_argument("--size", default="64M",
                    help="bytes of float32 per rank and call (K, M: powers of 1024)")
    ap.add_argument("--reps", type=int, default=3,
                    help="interleaved repetitions (the order of the widths rotates)")
    ap.add_argument("--rounding", default="nearest", choices=("nearest", "stochastic"))
    ap.add_argument("--mtu", type=int, default=9000, help="lab link MTU (jumbo frames)")
    ap.add_argument("--elements", type=int, default=0,
                    help="elements per packet (0: the most int32 that fit the MTU, a power "
                         "of two; the same count at every width: narrow packets are smaller)")
    ap.add_argument("--window", type=int, default=64, help="job window (slots)")
    ap.add_argument("--inflight", type=int, default=512 << 10,
                    help="bytes a worker keeps in flight at most")
    ap.add_argument("--queue-ms", type=float, default=50.0, help="tbf queue per link end")
    ap.add_argument("--no-gloo", dest="gloo", action="store_false",
                    help="leave out the Gloo row (the lab runs it by default)")
    ap.add_argument("--loopback", action="store_true",
                    help="local processes and switch, no lab (no root; no rate limit)")
    ap.add_argument("--id", default="prec", help="lab id")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per lab")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--master", help=argparse.SUPPRESS)
    a = ap.parse_args([str(v) for v in argv])
    try:
        a.size = _size(a.size)
    except ValueError as e:
        ap.error(f"--size: {e}")
    if a.size <= 0 or a.size % 4:
        ap.error(f"--size {a.size}: a positive multiple of 4 bytes")
    if a.reps < 1:
        ap.error("--reps: at least 1")
    if a.worker:
        return _lab_worker(a)
    if a.elements <= 0:
        a.elements = 1 << ((a.mtu - 20 - 8 - 28) // 4).bit_length() - 1
    from ina_fabric.host.lab import parse_rate
    rates = [r.strip() for r in a.rate.split(",")]
    if not a.loopback:
        from ina_fabric.host.lab import available
        why = available()
        if why:
            print(f"precision: skipped: {why} (--loopback runs without the lab)")
            return 0
    rows = []
    for hosts in (int(h) for h in a.hosts.split(",")):
        for rate in (["loopback"] if a.loopback else rates):
            res = _loopback(hosts, a) if a.loopback else _lab(hosts, rate, a)
            mbit = None if a.loopback else parse_rate(rate) / 1e6
            base = statistics.median(res["times"]["int32"])
            for name, ts in res["times"].items():
                med = statistics.median(ts)
                width = 0 if name == "gloo" else int(name[3:])
                checked = name == "gloo" or (res["worst"][name] <= 1.0 and res["identical"])
                row = {"width": width if width else "gloo", "hosts": hosts,
                       "rate_mbit": mbit, "time_s": med, "time_s_stats": _stats(ts),
                       "times_s": ts, "speedup_vs_int32": base / med,
                       "speedup_vs_int32_stats": {
                           "min": base / max(ts), "median": base / med,
                           "max": base / min(ts)},
                       "max_error_over_bound": None if name == "gloo" else res["worst"][name],
                       "checked": checked, "rounding": a.rounding,
                       "size_bytes": a.size, "elements": a.elements}
                if width in TARGETS:
                    row["target_speedup"] = TARGETS[width]
                    row["meets_target"] = base / med >= TARGETS[width]
                rows.append(row)
                err = "" if name == "gloo" else \
                    f", error/bound {res['worst'][name]:.3f}"
                print(f"{hosts} hosts at {rate}: {name:>5s} {med:8.3f} s (min "
                      f"{min(ts):.3f}, max {max(ts):.3f}), int32/{name} = "
                      f"{base / med:4.2f}{err}; {'checked' if checked else 'NOT CHECKED'}",
                      flush=True)
    write("precision", {"rows": rows, "reps": a.reps, "mtu": a.mtu,
                        "elements": a.elements, "window": a.window, "size": a.size,
                        "inflight": a.inflight, "queue_ms": a.queue_ms,
                        "loopback": a.loopback, "targets": {str(k): v for k, v in
                                                            TARGETS.items()},
                        "note": "medians of interleaved repetitions (the order of the "
                                "widths rotates each repetition); each time is the slowest "
                                "rank's; the same links for every width and for Gloo; "
                                "every result checked against the float64 sum and the "
                                "width's bound (docs/precision.md), and identical on "
                                "every rank"})
    return 0 if all(r["checked"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
