"""Run a function on ``world`` local ranks (processes on loopback) and gather results.

``run_ranks(world, fn, *args)`` forks ``world`` processes; rank ``r`` calls
``fn(rank, world, store, *args)`` with a shared ``DirStore`` for rendezvous, and the list
of return values (picklable) comes back in rank order. An exception in a rank is re-raised
here with its traceback text.
"""

import multiprocessing as mp
import tempfile
import traceback

from .base import DirStore

__all__ = ["run_ranks"]


def _child(fn, rank, world, path, args, q):
    try:
        res = fn(rank, world, DirStore(path), *args)
        q.put((rank, True, res))
    except BaseException:
        q.put((rank, False, traceback.format_exc()))


def run_ranks(world, fn, *args, timeout=300.0, start_method="fork"):
    ctx = mp.get_context(start_method)
    with tempfile.TemporaryDirectory(prefix="ina-rdv-") as path:
        q = ctx.Queue()
        procs = [ctx.Process(target=_child, args=(fn, r, world, path, args, q), daemon=True)
                 for r in range(world)]
        for p in procs:
            p.start()
        results = [None] * world
        errors = []
        try:
            for _ in range(world):
                rank, ok, res = q.get(timeout=timeout)
                if ok:
                    results[rank] = res
                else:
                    errors.append(f"rank {rank}:\n{res}")
                    break
        finally:
            for p in procs:
                p.join(timeout=5 if not errors else 0.5)
                if p.is_alive():
                    p.kill()
                    p.join()
        if errors:
            raise RuntimeError("a rank failed: " + errors[0])
        return results
