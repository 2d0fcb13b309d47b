"""Shared by the lab benches: wait for the rank processes each bench starts in the lab's
host namespaces, bounded in time, and take rank 0's figures."""

import json
import time

__all__ = ["gather"]


def gather(procs, timeout: float, names, tail: int = 2000) -> dict:
    """Wait up to ``timeout`` seconds in all for every process of ``procs`` (one per rank,
    started with stdout and stderr piped, text mode), kill any still running, raise
    RuntimeError naming each rank that failed (``names[i]``, its exit status, the last
    ``tail`` characters of its stderr), and return the JSON line rank 0 printed last."""
    end = time.monotonic() + timeout
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=max(1.0, end - time.monotonic())))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    bad = [(names[i], p.returncode, e[-tail:]) for i, (p, (o, e)) in
           enumerate(zip(procs, outs)) if p.returncode]
    if bad:
        raise RuntimeError(f"ranks failed: {bad}")
    return json.loads(outs[0][0].strip().splitlines()[-1])
