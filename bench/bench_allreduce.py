"""Allreduce through the software switch against torch.distributed.all_reduce on Gloo:
2 and 4 workers x {256 KB, 4 MB, 64 MB}, as a ratio measured side by side in one run."""

import multiprocessing as mp
import time

import numpy as np

from ina_fabric.bench._results import write

SIZES = {"256KB": 256 << 10, "4MB": 4 << 20, "64MB": 64 << 20}


def _worker(rank, world, port, switch, sizes, reps, q):
    import torch
    import torch.distributed as dist
    from ina_fabric.host.ddp.hook import InaHookState
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    from ina_fabric.protocol.jobtable import LINK_DEFAULTS
    state = InaHookState.from_env(switch=switch, elements=LINK_DEFAULTS["loopback"].elements)
    client = state.collective
    out = {}
    for name, nbytes in sizes.items():
        x = torch.randn(nbytes // 4, generator=torch.Generator().manual_seed(rank))
        client.allreduce(x.numpy())          # warm-up
        dist.all_reduce(x.clone())
        tg, ti = [], []
        for _ in range(reps):                # interleaved: same machine state for both
            dist.barrier()
            y = x.clone()
            t = time.perf_counter()
            dist.all_reduce(y)
            tg.append(time.perf_counter() - t)
            dist.barrier()
            t = time.perf_counter()
            client.allreduce(x.numpy())
            ti.append(time.perf_counter() - t)
        out[name] = (float(np.median(tg)), float(np.median(ti)))
    if rank == 0:
        q.put(out)
    state.close()
    dist.barrier()
    dist.destroy_process_group()


def measure(world, sizes, reps):
    import torch  # noqa: F401  (inherited by the forked workers)
    ctx = mp.get_context("fork")
    from ina_fabric.host.cluster import start_switch_process, free_tcp_port
    switch, sproc = start_switch_process(ctx)
    q = ctx.Queue()
    port = free_tcp_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, switch, sizes, reps, q))
             for r in range(world)]
    for p in procs:
        p.start()
    res = q.get(timeout=1800)
    for p in procs:
        p.join(60)
    sproc.terminate()
    return res


def main(argv=()):
    import argparse
    ap = argparse.ArgumentParser(prog="ina bench allreduce", description=__doc__.strip())
    ap.add_argument("--quick", action="store_true", help="skip the 64 MB size")
    quick = ap.parse_args(list(argv)).quick
    sizes = {k: v for k, v in SIZES.items() if not (quick and k == "64MB")}
    reps = 3
    rows = []
    for world in (2, 4):
        res = measure(world, sizes, reps)
        for name, (tg, ti) in res.items():
            rows.append({"workers": world, "size": name, "gloo_ms": tg * 1e3,
                         "ina_ms": ti * 1e3, "ratio_ina_to_gloo": ti / tg})
            print(f"{world} workers {name:>6s}: ina / gloo time = {ti / tg:5.2f}x "
                  f"(target <= 1.5x on loopback)")
    write("allreduce", {"rows": rows, "reps": reps, "note": "medians, interleaved runs"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
