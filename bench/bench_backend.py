"""The ``ina`` torch.distributed backend against the raw SwitchClient it drives: 4 ranks,
a 4 MB all_reduce, interleaved, median over reps of the slowest rank; the overhead of
the backend (wire thread, Work, result written in place) over the client's own call."""

import multiprocessing as mp
import os
import time

import numpy as np

from ina_fabric.bench._results import write


def _worker(rank, world, store, port, switch, nbytes, reps):
    import torch
    import torch.distributed as dist
    import ina_fabric.distributed  # noqa: F401
    torch.set_num_threads(1)
    os.environ["INA_SWITCH"] = f"{switch[0]}:{switch[1]}"
    os.environ.setdefault("INA_ELEMENTS", "8192")          # loopback packets
    dist.init_process_group("ina", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    pg = dist.distributed_c10d._get_default_group()
    client = pg.state.collective
    x = torch.randn(nbytes // 4, generator=torch.Generator().manual_seed(rank))
    y = x.clone()
    from ina_fabric.host.ddp.backend import CHECK_SIZES_CALLS
    for _ in range(CHECK_SIZES_CALLS + 1):   # warm-up, both paths; past the first calls,
        dist.all_reduce(y)                   # whose sizes the backend checks across ranks
    client.allreduce(x.numpy())              # (a start-up cost, see the README)
    def backend():
        y.copy_(x)
        dist.barrier()
        t = time.perf_counter()
        dist.all_reduce(y)
        tb.append(time.perf_counter() - t)

    def raw():
        dist.barrier()
        t = time.perf_counter()
        client.allreduce(x.numpy())
        tc.append(time.perf_counter() - t)

    tb, tc = [], []
    for i in range(reps):   # interleaved, alternating which goes first (no order bias)
        for f in ((backend, raw) if i % 2 == 0 else (raw, backend)):
            f()
    dist.destroy_process_group()
    return tb, tc


def measure(world, nbytes, reps):
    import torch  # noqa: F401  (inherited by the forked ranks)
    from ina_fabric.host.cluster import start_switch_process, free_tcp_port, run_ranks
    switch, sproc = start_switch_process(mp.get_context("fork"))
    try:
        times = run_ranks(world, _worker, free_tcp_port(), switch, nbytes, reps,
                          timeout=600)
    finally:
        sproc.terminate()
    # per rep, the slowest rank; then the median over reps
    backend = np.max([t[0] for t in times], axis=0)
    raw = np.max([t[1] for t in times], axis=0)
    return float(np.median(backend)), float(np.median(raw)), backend.tolist(), raw.tolist()


def main(argv=()):
    import argparse
    ap = argparse.ArgumentParser(prog="ina bench backend", description=__doc__.strip())
    ap.add_argument("--workers", type=int, default=4)
    from ina_fabric.host.commands import size_arg
    ap.add_argument("--size", type=size_arg, default="4M",
                    help="bytes per all_reduce (default 4M)")
    ap.add_argument("--reps", type=int, default=25, help="interleaved repetitions (>= 5)")
    a = ap.parse_args(list(argv))
    nbytes = a.size
    reps = max(5, a.reps)
    tb, tc, allb, allc = measure(a.workers, nbytes, reps)
    overhead = tb / tc - 1
    print(f"{a.workers} workers {nbytes >> 10} KiB: backend {tb * 1e3:.1f} ms, raw client "
          f"{tc * 1e3:.1f} ms, overhead {overhead * 100:+.1f}% (target < 10%)")
    write("backend", {"workers": a.workers, "bytes": nbytes, "reps": reps,
                      "backend_ms": tb * 1e3, "raw_client_ms": tc * 1e3,
                      "overhead": overhead, "target": 0.10,
                      "backend_ms_per_rep": [t * 1e3 for t in allb],
                      "raw_client_ms_per_rep": [t * 1e3 for t in allc],
                      "note": "median over interleaved reps (alternating order) of the "
                              "slowest rank; shared machines are noisy: rerun"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
