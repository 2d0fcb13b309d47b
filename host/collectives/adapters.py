"""The other collectives behind the same ``Collective`` interface.

* ``SwitchCollective``: in-network aggregation through ``SwitchClient`` (reliable or
  bounded). In bounded mode with a ``SwitchDeadline`` policy, the first K calls run in
  reliable mode (calibration), then rank 0 sets the switch's per-job deadline from the
  policy after every call (``LiveSwitch`` control: a live change that keeps the slots;
  a CONTROL datagram would reinstall the job and reset them).
* ``GlooCollective``: ``torch.distributed.all_reduce`` on the Gloo backend (the baseline).
* ``LiveSwitch``: a software switch (``host.switch.SwitchServer``) in its own process, with
  a small side port taking ``{"job", "deadline", "mode"}`` JSON to change a job live.
"""

import json
import multiprocessing as mp
import socket
import threading
import time

import numpy as np

from .base import Collective
from ..deadline import DeadlinePolicy, SwitchDeadline

__all__ = ["SwitchCollective", "GlooCollective", "LiveSwitch", "switch_collective"]


def _live_switch_main(conn, impairment):
    from ..switch import SwitchServer
    server = SwitchServer([], "127.0.0.1", 0, impairment=impairment)
    ctl = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    ctl.bind(("127.0.0.1", 0))

    def control():
        while True:
            data, src = ctl.recvfrom(4096)
            try:
                req = json.loads(data)
                changes = {k: req[k] for k in ("deadline", "mode") if k in req}
                server.model.retune(int(req["job"]), **changes)   # live: slots are kept
                ctl.sendto(b"ok", src)
            except Exception as e:  # a bad request is answered, never fatal
                ctl.sendto(f"error {e!r}".encode(), src)

    threading.Thread(target=control, daemon=True).start()
    conn.send((server.address, ctl.getsockname()))
    server.serve_forever()


class LiveSwitch:
    """``with LiveSwitch() as sw:`` a software switch process; ``sw.address``,
    ``sw.control``; ``LiveSwitch.set(control, job, deadline=..., mode=...)`` from anywhere."""

    def __init__(self, impairment=None):
        ctx = mp.get_context("spawn")
        a, b = ctx.Pipe()
        self.proc = ctx.Process(target=_live_switch_main, args=(b, impairment), daemon=True)
        self.proc.start()
        if not a.poll(60):
            self.proc.kill()
            raise RuntimeError("live switch did not start")
        self.address, self.control = a.recv()

    @staticmethod
    def set(control, job, timeout=1.0, **changes):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.settimeout(timeout)
        try:
            s.sendto(json.dumps({"job": job, **changes}).encode(), tuple(control))
            reply = s.recv(4096)
        finally:
            s.close()
        if reply != b"ok":
            raise RuntimeError(f"live switch: {reply.decode(errors='replace')}")

    def close(self):
        self.proc.terminate()
        self.proc.join(5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class SwitchCollective(Collective):
    """In-network allreduce via ``SwitchClient``; ``policy`` (bounded mode only) adapts
    the switch's slot deadline; ``control`` is the ``LiveSwitch`` side port (used by
    rank 0 only)."""

    def __init__(self, client, policy: SwitchDeadline | None = None, control=None):
        self.client = client
        self.rank, self.world = client.worker, client.nworkers
        self.bounded = client.mode != "reliable"
        self.bounded_mode = client.mode          # "bounded" or "bounded-skip"
        self.name = f"switch-{client.mode}"
        self.policy = policy if self.bounded else None
        self.control = control
        self.calls = 0
        if self.policy is not None and self.policy.calibrating:
            self.client.mode = "reliable"
            self._set_switch(mode="reliable")

    def _set_switch(self, **changes):
        if self.control is not None and self.rank == 0:
            LiveSwitch.set(self.control, self.client.job, **changes)

    def allreduce(self, x):
        x0 = np.asarray(x, np.float32)
        calibrating = self.policy is not None and self.policy.calibrating
        out, s = self.client.allreduce(x0)
        st = s.as_dict()
        n = x0.size
        st.update(entries=n, lost_fraction=(s.entries_lost / n) if n else 0.0,
                  calibrating=calibrating, missing=[], call=self.calls)
        self.calls += 1
        if self.policy is not None:
            P = -(-n // self.client.elements) + self.client.window
            was = self.policy.calibrating
            d = self.policy.observe_call(s.seconds, P, self.client.window,
                                         st["lost_fraction"], s.partial_slots)
            st["switch_deadline"] = self.client.deadline
            if not self.policy.calibrating:
                self.client.deadline = d
                if was:
                    self.client.mode = self.bounded_mode
                    self._set_switch(mode=self.bounded_mode, deadline=d)
                elif abs(d - st["switch_deadline"]) > 0.05 * st["switch_deadline"]:
                    self._set_switch(deadline=d)
        return out.reshape(x0.shape), st

    def close(self):
        self.client.close()


def switch_collective(rank, world, store, switch_addr, control=None, *, job=1,
                      settings=None, policy=None, impairment=None, prefix="sw"):
    """Make one rank's ``SwitchCollective``: bind, publish the address through ``store``,
    rank 0 installs the job on the switch (CONTROL datagram), everyone waits for it.
    ``settings``: a ``JobSettings`` (default: the Ethernet defaults)."""
    from ..transport.switch_client import SwitchClient
    from ina_fabric.protocol.jobtable import JobConfig, job_defaults
    from ina_fabric.protocol.control_client import send_job
    s = settings or job_defaults()
    client = SwitchClient(tuple(switch_addr), job, rank, world, s.window, s.elements, s.mode,
                          bind=("127.0.0.1", 0), deadline=s.deadline, impairment=impairment)
    store.set(f"{prefix}/addr/{rank}", f"{client.address[0]}:{client.address[1]}")
    if rank == 0:
        members = tuple(store.get(f"{prefix}/addr/{i}").decode() for i in range(world))
        cfg = JobConfig.from_settings(job, members, s)
        send_job(tuple(switch_addr), cfg)
        store.set(f"{prefix}/ready", str(cfg.session))
    client.session = int(store.get(f"{prefix}/ready"))     # the install's session id
    return SwitchCollective(client, policy, control)


class GlooCollective(Collective):
    """``torch.distributed.all_reduce`` (SUM) on an initialized Gloo process group."""
    name = "gloo"

    def __init__(self, group=None):
        import torch.distributed as dist
        if not dist.is_initialized():
            raise RuntimeError("GlooCollective: torch.distributed is not initialized")
        self.dist, self.group = dist, group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)

    def allreduce(self, x):
        import torch
        x0 = np.asarray(x, np.float32)
        t0 = time.perf_counter()
        t = torch.from_numpy(np.array(x0, np.float32, copy=True))
        self.dist.all_reduce(t, group=self.group)
        return t.numpy().reshape(x0.shape), {"seconds": time.perf_counter() - t0,
                                             "entries": x0.size, "entries_lost": 0,
                                             "lost_fraction": 0.0, "missing": []}
