"""Allreduce through the software switch against torch.distributed.all_reduce on Gloo:
2 and 4 workers x {256 KB, 4 MB, 64 MB}, as ratios measured side by side in one run.

How it measures (so the figures can be trusted):

* the same worker processes run both sides, interleaved: each repetition times Gloo and
  ina back to back, in alternating order, each after a barrier;
* a repetition's time is the SLOWEST rank's (every rank reports, the max is kept); small
  sizes run ``inner`` calls back to back per repetition (at least 4 MB in all), so a
  repetition is not one clock tick;
* every result is checked: ina's against the quantization bound of each chunk
  (``quantize.error_bound`` of the agreed exponent, plus float32 rounding) around the
  exact float64 sum, Gloo's against the float32 summation bound; every rank regenerates
  all ranks' inputs from their seeds to compute that sum;
* CPU-seconds per allreduce of each side: every worker's own CPU time (``process_time``:
  all its threads, Gloo's included) summed over the ranks, plus, for ina, the switch
  process's (``/proc/<pid>/stat``, clock ticks, over all repetitions of a size);
* numba's kernels are compiled before any timer starts (``quantize.warm_up`` in the
  parent, inherited by the forked workers), and one untimed call of each side per size
  comes first.

The switch is ``cluster.start_switch_process`` with the compiled data path
(``engine="fast"``; the Python model, said so, where the extension is not built); the
job's RESULTs go to a loopback multicast group.
"""

import multiprocessing as mp
import os
import time

import numpy as np

from ina_fabric.bench._results import write

SIZES = {"256KB": 256 << 10, "4MB": 4 << 20, "64MB": 64 << 20}
TARGETS = {4: {"256KB": 1.2, "4MB": 1.0, "64MB": 1.0}, 2: {"4MB": 1.5, "64MB": 1.5}}


def _inputs(rank, world, size_index, n):
    rng = np.random.default_rng([17, world, size_index, rank])
    return (rng.standard_normal(n) * rng.uniform(0.1, 10)).astype(np.float32)


def _bounds(world, size_index, n, elements):
    """(exact float64 sum, ina bound per element, Gloo bound per element)."""
    from ina_fabric.host.transport import quantize as Q
    exact = np.zeros(n, np.float64)
    absum = np.zeros(n, np.float64)
    exps = None
    for r in range(world):
        x = _inputs(r, world, size_index, n)
        exact += x
        absum += np.abs(x)
        e = Q.local_exponents(x, elements).astype(np.int16)
        exps = e if exps is None else np.maximum(exps, e)
    per_chunk = np.array([Q.error_bound(int(e), world) for e in exps])
    ina = np.repeat(per_chunk, elements)[:n] + np.abs(exact) * 2.0 ** -23
    gloo = absum * world * 2.0 ** -23
    return exact, ina, gloo


def _switch_cpu(pid):
    """CPU-seconds (user + system) the switch process has used so far."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            f = fh.read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def _worker(rank, world, port, switch, switch_pid, sizes, reps, q):
    import torch
    import torch.distributed as dist
    from ina_fabric.host.ddp.hook import InaHookState
    from ina_fabric.protocol.jobtable import LINK_DEFAULTS
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        elements = LINK_DEFAULTS["loopback"].elements
        state = InaHookState.from_env(switch=switch, elements=elements,
                                      window=LINK_DEFAULTS["loopback"].window)
        client = state.collective
        report = {"multicast": client.group is not None, "sizes": {}}
        for si, (name, nbytes) in enumerate(sizes.items()):
            n = nbytes // 4
            inner = max(1, min(16, (4 << 20) // nbytes))
            x = _inputs(rank, world, si, n)
            exact, bound_ina, bound_gloo = _bounds(world, si, n, elements)
            out = np.empty(n, np.float32)
            y = torch.empty(n)
            checked_ina = checked_gloo = True
            worst_ina = worst_gloo = 0.0
            client.allreduce(x, out=out)                 # untimed: first use of a size
            y.copy_(torch.from_numpy(x))
            dist.all_reduce(y)
            rows = []
            sw0 = _switch_cpu(switch_pid) if rank == 0 else 0.0
            retrans0 = client.total.retransmits
            for rep in range(reps):
                t = {}
                for side in (("gloo", "ina") if rep % 2 == 0 else ("ina", "gloo")):
                    dist.barrier()
                    wall, cpu = 0.0, 0.0
                    for _ in range(inner):
                        if side == "gloo":
                            y.copy_(torch.from_numpy(x))         # outside the timer
                        c0, t0 = time.process_time(), time.perf_counter()
                        if side == "gloo":
                            dist.all_reduce(y)
                        else:
                            client.allreduce(x, out=out)
                        wall += time.perf_counter() - t0
                        cpu += time.process_time() - c0
                    t[side] = (wall / inner, cpu / inner)
                    res = y.numpy() if side == "gloo" else out
                    ratio = float((np.abs(res - exact) /
                                   (bound_gloo if side == "gloo" else bound_ina)).max())
                    if side == "gloo":
                        worst_gloo = max(worst_gloo, ratio)
                        checked_gloo &= ratio <= 1.0
                    else:
                        worst_ina = max(worst_ina, ratio)
                        checked_ina &= ratio <= 1.0
                # the slowest rank's time; the ranks' CPU-seconds summed
                v = torch.tensor([t["ina"][0], t["gloo"][0]], dtype=torch.float64)
                dist.all_reduce(v, op=dist.ReduceOp.MAX)
                c = torch.tensor([t["ina"][1], t["gloo"][1]], dtype=torch.float64)
                dist.all_reduce(c)
                rows.append((float(v[0]), float(v[1]), float(c[0]), float(c[1])))
            flags = torch.tensor([int(checked_ina), int(checked_gloo)], dtype=torch.int64)
            dist.all_reduce(flags, op=dist.ReduceOp.MIN)
            retrans = torch.tensor([client.total.retransmits - retrans0])
            dist.all_reduce(retrans)
            worst = torch.tensor([worst_ina, worst_gloo], dtype=torch.float64)
            dist.all_reduce(worst, op=dist.ReduceOp.MAX)
            if rank == 0:
                sw = (_switch_cpu(switch_pid) - sw0) / (reps * inner)
                report["sizes"][name] = {
                    "reps": rows, "inner": inner, "switch_cpu": sw,
                    "checked_ina": bool(flags[0]), "checked_gloo": bool(flags[1]),
                    "bound_ratio_ina": float(worst[0]), "bound_ratio_gloo": float(worst[1]),
                    "retransmits": int(retrans[0])}
        if rank == 0:
            q.put(("ok", report))
        state.close()
        dist.barrier()
    except BaseException as e:
        q.put(("error", f"rank {rank}: {type(e).__name__}: {e}"))
        raise
    finally:
        dist.destroy_process_group()


def _start_switch(ctx):
    from ina_fabric.host.cluster import start_switch_process
    from ina_fabric.host.switch import fast
    if not fast.available():
        print(f"note: {fast.WHY_NOT}", flush=True)
    engine = "fast" if fast.available() else "model"
    return start_switch_process(ctx, engine=engine) + (engine,)


def measure(world, sizes, reps):
    import torch  # noqa: F401  (inherited by the forked workers)
    from ina_fabric.host.transport.quantize import warm_up
    from ina_fabric.host.cluster import free_tcp_port
    warm_up()
    ctx = mp.get_context("fork")
    switch, sproc, engine = _start_switch(ctx)
    q = ctx.Queue()
    port = free_tcp_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, switch, sproc.pid, sizes,
                                               reps, q))
             for r in range(world)]
    for p in procs:
        p.start()
    try:
        kind, res = q.get(timeout=3600)
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.terminate()
        sproc.terminate()
        sproc.join(5)
    if kind == "error":
        raise RuntimeError(res)
    res["engine"] = engine
    return res


def summarize(world, name, r):
    """One JSON row from a size's repetitions."""
    reps = np.array(r["reps"])           # (ina s, gloo s, ina worker cpu, gloo cpu)
    ratio = reps[:, 0] / reps[:, 1]
    ina_cpu = float(reps[:, 2].mean()) + r["switch_cpu"]
    gloo_cpu = float(reps[:, 3].mean())
    return {"workers": world, "size": name, "bytes": SIZES[name],
            "ratio_median": float(np.median(ratio)), "ratio_min": float(ratio.min()),
            "ratio_max": float(ratio.max()),
            "ina_ms_median": float(np.median(reps[:, 0])) * 1e3,
            "gloo_ms_median": float(np.median(reps[:, 1])) * 1e3,
            "ina_cpu_ms": ina_cpu * 1e3, "ina_worker_cpu_ms": float(reps[:, 2].mean()) * 1e3,
            "switch_cpu_ms": r["switch_cpu"] * 1e3, "gloo_cpu_ms": gloo_cpu * 1e3,
            "cpu_ratio": ina_cpu / gloo_cpu if gloo_cpu > 0 else float("inf"),
            "checked": bool(r["checked_ina"] and r["checked_gloo"]),
            "bound_ratio_ina": r["bound_ratio_ina"], "bound_ratio_gloo": r["bound_ratio_gloo"],
            "retransmits": r["retransmits"], "reps": len(reps), "calls_per_rep": r["inner"],
            "target": TARGETS.get(world, {}).get(name)}


def backend_row(res: dict) -> dict:
    """The backend path's row from ``bench_backend.measure``'s result: ``dist.all_reduce``
    on the ``ina`` backend against the raw client on the same ranks (medians of the
    slowest rank's times)."""
    tb, tc = res["ina_ms"], res["raw_client_ms"]
    n = res["size"]
    size = f"{n >> 20}MB" if n >= 1 << 20 else f"{n >> 10}KB"
    return {"workers": res["ranks"], "size": size, "path": "backend",
            "backend_ms": tb, "raw_client_ms": tc, "overhead": tb / tc - 1,
            "checked": res["checked"], "target": 0.10}


def main(argv=()):
    import argparse
    ap = argparse.ArgumentParser(prog="ina bench allreduce", description=__doc__.strip(),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="skip the 64 MB size")
    ap.add_argument("--reps", type=int, default=5, help="repetitions (>= 5; default 5)")
    ap.add_argument("--workers", default="2,4", help="comma-separated worker counts")
    ap.add_argument("--no-backend", action="store_true",
                    help="skip the row of the torch.distributed backend path (4 workers, "
                         "4 MB: dist.all_reduce on the `ina` backend vs the raw client)")
    a = ap.parse_args(list(argv))
    if a.reps < 5:
        ap.error("--reps: at least 5 (min/median/max need them)")
    sizes = {k: v for k, v in SIZES.items() if not (a.quick and k == "64MB")}
    rows, engine, mcast = [], None, None
    print(f"{'workers':>7s} {'size':>6s} {'ina/gloo min':>12s} {'median':>7s} {'max':>6s} "
          f"{'ina ms':>8s} {'gloo ms':>8s} {'cpu ina/gloo':>12s} {'(worker+switch ms)':>18s} "
          f"{'checked':>7s} {'retrans':>7s} {'target':>6s}")
    for world in (int(w) for w in a.workers.split(",")):
        res = measure(world, sizes, a.reps)
        engine, mcast = res["engine"], res["multicast"]
        for name, r in res["sizes"].items():
            row = summarize(world, name, r)
            rows.append(row)
            tgt = f"{row['target']:.1f}x" if row["target"] else "-"
            print(f"{world:7d} {name:>6s} {row['ratio_min']:11.2f}x {row['ratio_median']:6.2f}x "
                  f"{row['ratio_max']:5.2f}x {row['ina_ms_median']:8.2f} "
                  f"{row['gloo_ms_median']:8.2f} {row['cpu_ratio']:11.2f}x "
                  f"{row['ina_worker_cpu_ms']:8.1f}+{row['switch_cpu_ms']:<8.1f} "
                  f"{str(row['checked']):>7s} {row['retransmits']:7d} {tgt:>6s}", flush=True)
    backend = None
    if not a.no_backend:
        from ina_fabric.bench.bench_backend import measure as measure_backend
        backend = backend_row(measure_backend(4, 4 << 20, max(9, a.reps)))
        print(f"backend path, 4 workers 4MB: dist.all_reduce on `ina` "
              f"{backend['backend_ms']:.2f} ms vs the raw client "
              f"{backend['raw_client_ms']:.2f} ms: overhead {backend['overhead'] * 100:+.1f}% "
              f"(target < 10%)", flush=True)
    print(f"switch engine: {engine}; RESULTs by {'multicast' if mcast else 'unicast'}; "
          f"times: slowest rank, {a.reps} interleaved repetitions; cpu: all workers + "
          f"switch (ina) vs all workers (Gloo), per allreduce")
    write("allreduce", {"rows": rows, "reps": a.reps, "engine": engine,
                        "multicast": mcast, "backend_row": backend,
                        "note": "ratios = ina time / Gloo time of the slowest rank, per "
                                "repetition, interleaved; checked = every result within "
                                "its bound (ina: quantization, Gloo: float32 summation)"})
    return 0 if all(r["checked"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
