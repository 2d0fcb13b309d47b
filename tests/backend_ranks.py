"""One rank of tests/test_backend.py's collectives check, under torchrun: a plain
all_reduce loop on the ``ina`` backend against Gloo's exact sums, async works, and the
collectives that are delegated to Gloo. Writes OUT.rank<r>.json."""

import faulthandler
import json
import sys

import numpy as np
import torch
import torch.distributed as dist

import ina_fabric.distributed  # noqa: F401
from ina_fabric.host.transport import quantize as Q


def main(out):
    faulthandler.dump_traceback_later(40, exit=True)   # a hang: every stack, then exit
    dist.init_process_group("ina")
    rank, world = dist.get_rank(), dist.get_world_size()
    pg = dist.distributed_c10d._get_default_group()
    gloo = dist.new_group(backend="gloo")
    try:                                        # sizes differ across ranks: refused
        dist.all_reduce(torch.ones(1000 + rank))    # on every rank (the first calls are
        mismatch = None                             # checked), nothing sent
    except ValueError as e:
        mismatch = str(e)
    after = torch.ones(700)                     # and the job is still in step
    dist.all_reduce(after)
    worst = 0.0
    for it in range(20):                        # a plain all_reduce loop, SUM and AVG
        g = torch.Generator().manual_seed(it * 100 + rank)
        x = torch.randn(5000 + 977 * it, generator=g) * (it + 1)
        ref = x.clone()
        dist.all_reduce(ref, group=gloo)
        op = dist.ReduceOp.AVG if it % 2 else dist.ReduceOp.SUM
        y = x.clone()
        dist.all_reduce(y, op=op)
        if it % 2:
            ref /= world
        big = torch.zeros_like(ref)
        dist.all_reduce(big.copy_(x.abs()), op=dist.ReduceOp.MAX, group=gloo)
        bound = world * float(big.max()) * 2.0 ** -Q.scale_bits(world) + 1e-6 * float(ref.abs().max())
        worst = max(worst, float((y - ref).abs().max()) / bound)
    works = [dist.all_reduce(t, async_op=True) for t in
             [torch.full((1000,), float(rank + i)) for i in range(4)]]
    sums = [float(w.get_future().wait()[0][0]) for w in works]
    for w in works:
        w.wait()
    gathered = [torch.zeros(3) for _ in range(world)]
    dist.all_gather(gathered, torch.full((3,), float(rank)))
    b = torch.tensor([float(rank)])
    dist.broadcast(b, src=world - 1)
    rs = torch.zeros(2)
    dist.reduce_scatter_tensor(rs, torch.arange(2.0 * world))
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank})
    dist.barrier()
    sub = dist.new_group(list(range(world)))
    s = torch.ones(4)
    dist.all_reduce(s, group=sub)
    res = {"worst_over_bound": worst, "async_sums": sums,
           "gathered": [float(t[0]) for t in gathered], "broadcast": float(b),
           "reduce_scatter": rs.tolist(), "objects": [o["rank"] for o in objs],
           "subgroup_sum": float(s[0]), "subgroup_job": sub.state.collective.job,
           "switch_calls": pg.state.stats.calls, "backend": dist.get_backend(),
           "mismatch": mismatch, "after_mismatch": after.tolist()}
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump(res, f)
    dist.destroy_process_group()


def restart(out):
    """tests/test_backend_restart.py, under ``torchrun --max-restarts 1``: attempt 0
    reduces once, then rank 0 puts a contribution on the wire that rank 1 never
    matches (a slot half full of the crashed run), and rank 1 crashes. torchrun starts
    both again; attempt 1 must get its job id back at once and sum exactly, untouched
    by the crashed run. Each attempt writes OUT.attempt<a>.rank<r>.json."""
    import os
    import warnings
    faulthandler.dump_traceback_later(40, exit=True)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist.init_process_group("ina")
    rank, world = dist.get_rank(), dist.get_world_size()
    pg = dist.distributed_c10d._get_default_group()
    t = torch.full((3000,), float(rank + 1))
    dist.all_reduce(t)
    res = {"attempt": attempt, "session": pg.state.collective.session,
           "sum": sorted(set(t.tolist())), "calls": pg.state.stats.calls,
           "warnings": [str(w.message) for w in caught if "took the id back" in
                        str(w.message)]}
    with open(f"{out}.attempt{attempt}.rank{rank}.json", "w") as f:
        json.dump(res, f)
    if attempt == 0:
        dist.barrier()
        if rank == 0:                 # half a slot, then the crash kills this rank too
            dist.all_reduce(torch.full((3000,), 100.0), async_op=True)
            import time
            time.sleep(30)
        else:
            import time
            time.sleep(0.5)          # rank 0's DATA reaches the switch first
            os._exit(3)              # the crash
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--restart"]:
        restart(sys.argv[2])
    else:
        main(sys.argv[1])
