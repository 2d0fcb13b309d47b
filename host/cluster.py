"""Local process clusters: the one place that starts switches and ranks on this machine.

- :func:`start_switch_process`: a software switch with an empty job table in a child.
- :func:`run_ranks`: ``world`` forked ranks calling ``fn(rank, world, store, *args)``
  with a shared :class:`~ina_fabric.host.collectives.base.DirStore`; results in rank order,
  a failing rank's traceback re-raised here.
- :class:`LocalCluster`: a switch and N worker processes (``ina allreduce``, tests,
  benches). Workers bind ephemeral UDP ports first; the parent then installs the job on
  the switch with a CONTROL datagram (the same path an FPGA's job table is loaded by), so
  parallel runs never collide on ports.
- :func:`free_tcp_port`: a rendezvous port for torch.distributed.
"""

from dataclasses import dataclass, field
import multiprocessing as mp
import socket
import sys
import tempfile
import time
import traceback

import numpy as np

from ina_fabric.protocol.jobtable import JobConfig, JobSettings, LINK_DEFAULTS, loopback_group

from .transport.impair import Impairment

__all__ = ["WorkerSpec", "LocalCluster", "worker_data", "run_ranks", "start_switch_process",
           "free_tcp_port", "free_udp_ports"]


def free_tcp_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a rendezvous)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def free_udp_ports(n: int) -> list[int]:
    """``n`` distinct UDP ports on 127.0.0.1 that were free a moment ago (all bound at
    once, then released)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _serve(conn, engine):
    from .oneline import quiet_child
    from .switch import SwitchServer
    quiet_child()             # Ctrl-C: the parent ends the switch (terminate), quietly
    try:
        server = SwitchServer([], "127.0.0.1", 0, engine=engine,
                              log=lambda m: print(m, file=sys.stderr))
    except Exception as e:      # e.g. the RTL engine cannot be built here
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ok", server.address))
    try:
        server.serve_forever()
    finally:
        server.close()
    if server.failure:          # an RTL scoreboard disagreement: the exit status says so
        sys.exit(3)


def start_switch_process(ctx, engine="auto"):
    """A software switch with an empty job table (jobs arrive by CONTROL) in a child
    process of the multiprocessing context ``ctx``; ``engine`` as ``SwitchServer``'s.
    Returns (address, process)."""
    a, b = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(b, engine), daemon=True)
    proc.start()
    kind, value = a.recv()
    if kind == "error":
        proc.join(timeout=5)
        raise RuntimeError(f"the {engine} switch did not start: {value}")
    return tuple(value), proc



def _child(fn, rank, world, path, args, q):
    try:
        from .collectives.base import DirStore
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


@dataclass
class WorkerSpec:
    """N workers of one job on this host. ``settings``: the job's window, elements,
    deadline and mode (default: the loopback defaults); ``impairment``: the uplink policy
    each worker gets a fresh copy of (seeded per worker); ``session``: the session id of
    a job that a given switch already holds (``ina switch --jobs``: its TOML's
    ``session``); 0 when the job is installed here (a fresh one per run)."""
    job: int = 1
    nworkers: int = 4
    settings: JobSettings = field(default_factory=lambda: LINK_DEFAULTS["loopback"])
    base_port: int = 0           # 0: ephemeral ports
    impairment: Impairment = field(default_factory=Impairment)
    seed: int = 0
    session: int = 0
    #: the calls' precision (issue 40, docs/precision.md): a width, a string or a
    #: ``Precision``; None: int32
    precision: object = None


def worker_data(seed, worker, it, n):
    rng = np.random.default_rng([seed, worker, it])
    return (rng.standard_normal(n) * rng.uniform(0.1, 10)).astype(np.float32)


def _worker_main(spec, w, switch, conn, group, barrier):
    from .oneline import quiet_child
    from .transport import SwitchClient
    quiet_child()             # Ctrl-C: the parent ends the workers, quietly
    imp = spec.impairment.fresh(seed=spec.seed * 1000 + w + 1, log_drops=True)
    port = spec.base_port + w if spec.base_port else 0
    s = spec.settings
    try:
        client = SwitchClient(switch, spec.job, w, spec.nworkers, s.window, s.elements,
                              s.mode, bind=("127.0.0.1", port), deadline=s.deadline,
                              impairment=imp, group=group, precision=spec.precision)
    except (OSError, ValueError) as e:
        conn.send(("error", str(e)))
        return
    conn.send(("addr", (client.address, client.group)))
    while True:
        cmd = conn.recv()
        if cmd is None:
            break
        if cmd[0] == "start":         # the install's session and first seq, from the parent
            client.start(cmd[1], cmd[2])
            continue
        n, iters = cmd
        from .transport import quantize as Q
        maxerr, worst_ratio, secs = 0.0, 0.0, 0.0
        try:
            for it in range(iters):
                x = worker_data(spec.seed, w, it, n)
                # start each call together: the time between calls differs per worker
                # (the checks below), and a peer that is late is not what is measured
                barrier.wait(timeout=60)
                step = client.seq
                t = time.perf_counter()
                y, _ = client.allreduce(x)
                secs += time.perf_counter() - t
                xs = [worker_data(spec.seed, v, it, n) for v in range(spec.nworkers)]
                exact = sum(v.astype(np.float64) for v in xs)
                err = np.abs(y.astype(np.float64) - exact)
                # the call's bound (docs/precision.md) from the exponents the workers
                # agreed on (the max of their proposals), plus float32 rounding
                p = client.precision
                rot = None
                if p.rotate:
                    from .collectives.hadamard import RandomizedHadamard, DEFAULT_BLOCK
                    rot = RandomizedHadamard(client._seed(), block=DEFAULT_BLOCK)
                bound = Q.error_bounds(xs, spec.settings.elements, p.bits, p.stochastic,
                                       rotate=rot, step=step) + \
                    sum(np.abs(v.astype(np.float64)) for v in xs) * \
                    (2.0 ** -20 if rot else 2.0 ** -23)
                maxerr = max(maxerr, float(err.max()))
                worst_ratio = max(worst_ratio, float((err / bound).max()))
            conn.send(("ok", {"seconds": secs, "max_error": maxerr,
                              "bound_ratio": worst_ratio, "stats": client.total.as_dict(),
                              "impairment": dict(imp.counts),
                              "dropped": list(imp.dropped)}))
        except Exception as e:  # report, don't hang the parent
            conn.send(("error", f"worker {w}: {type(e).__name__}: {e}"))
    client.close()


class LocalCluster:
    """``switch``: "ip:port" of a running switch whose job table already holds the job
    (default: start one here and install the job by CONTROL). The job installed here
    sends its RESULTs to a multicast group (``jobtable.loopback_group``) when
    ``multicast`` and every worker joined it, else one unicast copy per worker."""

    def __init__(self, spec: WorkerSpec, switch=None, timeout=120.0, multicast=True):
        self.spec, self.timeout = spec, timeout
        from .transport.quantize import warm_up
        warm_up()              # compiled once here; the forked workers inherit it
        self.ctx = mp.get_context("fork")
        self.procs, self.conns = [], []
        self.switch_proc = None
        if switch is None:
            self.switch, self.switch_proc = start_switch_process(self.ctx)
        else:
            host, _, port = switch.rpartition(":")
            self.switch = (host, int(port))
        # a group only for a job installed here (a given switch has its own table)
        self.group = loopback_group(self.switch, spec.job) \
            if multicast and self.switch_proc is not None else None

    def __enter__(self):
        spec = self.spec
        addrs, joined = [], []
        barrier = self.ctx.Barrier(spec.nworkers)
        for w in range(spec.nworkers):
            a, b = self.ctx.Pipe()
            p = self.ctx.Process(target=_worker_main,
                                 args=(spec, w, self.switch, b, self.group, barrier),
                                 daemon=True)
            p.start()
            self.procs.append(p)
            self.conns.append(a)
        for c in self.conns:
            kind, val = c.recv()
            if kind == "error":
                self.close()
                raise ValueError(val)
            addr, group = val
            addrs.append(f"{addr[0]}:{addr[1]}")
            joined.append(group)
        mcast = self.group if self.group and all(g == self.group for g in joined) else None
        if self.switch_proc is None and not spec.session:
            self.close()
            raise ValueError(self._no_session_reason())
        self.config = JobConfig.from_settings(spec.job, addrs, spec.settings, mcast,
                                              spec.session or None)
        position = 0
        if self.switch_proc is not None:
            from ina_fabric.protocol.control_client import send_job
            send_job(self.switch, self.config)
        else:     # a static job: a second run resumes at the switch's position
            from .transport.switch_client import static_position
            try:
                position = static_position(self.switch, spec.job, self.config.session,
                                           workers=spec.nworkers) or 0
            except OSError:
                self.close()
                raise
        for c in self.conns:
            c.send(("start", self.config.session, position))
        return self

    def _no_session_reason(self) -> str:
        """Why a run against a given switch cannot start without --session: the job is
        not there at all (STATUS says so), or its session id is needed."""
        at = f"the switch at {self.switch[0]}:{self.switch[1]}"
        from .switch import query_status
        try:
            jobs = query_status(self.switch, timeout=1.0).get("jobs", {})
        except Exception:  # noqa: BLE001 (no key, no answer: the general advice)
            jobs = None
        if jobs is not None and str(self.spec.job) not in jobs:
            held = ", ".join(sorted(jobs, key=int)) or "none"
            return (f"{at} has no job {self.spec.job} (it holds: {held}); check --job, or "
                    f"load the job (`ina switch --local-workers`, `ina hw-config`)")
        return (f"job {self.spec.job} on {at}: give its session id (the `session` of "
                f"its [[job]] table, --session)")

    def allreduce_check(self, n, iters=1):
        for c in self.conns:
            c.send((n, iters))
        results = []
        for c in self.conns:
            if not c.poll(self.timeout):
                raise TimeoutError(f"workers did not finish within {self.timeout}s")
            kind, val = c.recv()
            if kind == "error":
                raise RuntimeError(val)
            results.append(val)
        counters = {}
        if self.switch_proc is not None:
            from ina_fabric.protocol.control_client import query_status
            counters = {k: v for k, v in query_status(self.switch)["counters"].items() if v}
        return {
            "seconds": max(r["seconds"] for r in results),
            "max_error": max(r["max_error"] for r in results),
            "bound_ratio": max(r["bound_ratio"] for r in results),
            "within_bound": max(r["bound_ratio"] for r in results) <= 1.0,
            "stats": results[0]["stats"],
            "per_worker": results,
            "switch_counters": counters,
        }

    def close(self):
        for c in self.conns:
            try:
                c.send(None)
            except OSError:
                pass
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
        if self.switch_proc is not None:
            self.switch_proc.terminate()
            self.switch_proc.join(timeout=5)

    def __exit__(self, *exc):
        self.close()
