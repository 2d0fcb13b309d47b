"""Shared by the lab benches: wait for the rank processes each bench starts in the lab's
host namespaces, bounded in time, and take rank 0's figures."""

import json
import time

__all__ = ["gather", "lab_rank"]


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


def lab_rank(a, timeout_s: float):
    """In a rank process in its lab host's namespace: one torch thread, a Gloo group over
    the lab's eth0 (``a.master``, ``a.rank``, ``a.world``), and an ``InaHookState`` on
    the lab's switch with ``a.elements``, ``a.window`` and ``a.inflight``; exits, naming
    why, when no switch answers. Returns the state (its ``collective`` is the client)."""
    import os
    from datetime import timedelta
    import torch
    import torch.distributed as dist
    from ina_fabric.host.ddp.hook import InaHookState
    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = "eth0"
    dist.init_process_group("gloo", init_method=f"tcp://{a.master}", rank=a.rank,
                            world_size=a.world, timeout=timedelta(seconds=timeout_s))
    state = InaHookState.from_env(elements=a.elements, window=a.window,
                                  connect_timeout=5.0, bind_port=None)
    if not state.use_switch:
        raise SystemExit("no switch answered in the lab")
    state.collective.max_inflight_bytes = a.inflight
    return state
