"""``ina``: a torch.distributed backend whose all_reduce runs through the switch.

    import ina_fabric.distributed            # registers the backend "ina"
    dist.init_process_group("ina")           # instead of "gloo" (or "nccl")
    # done: DDP, dist.all_reduce, gradient accumulation, as before

The process group is a Python ``ProcessGroup`` with an inner Gloo group registered as
its backend for CPU and CUDA, so every collective this module does not override
(broadcast, all_gather, barrier, reduce_scatter, send/recv, all_to_all, the object
collectives, ...) runs on Gloo unchanged. ``allreduce`` is overridden: SUM and AVG (SUM,
then divided by the world size) of float32 tensors go through the switch; fp16/bf16 are
converted to float32 for the wire and the result rounded back; anything else (other ops,
integer, bool, float64 and complex tensors) goes to Gloo, exactly, unless ``dtypes`` is
``"strict"``, which refuses every tensor the switch does not carry with a one-line
TypeError. Each call is queued, in call order, on one wire thread per group and returns
at once with a ``Work`` whose future DDP waits on, so backward goes on while a bucket is
on the wire (as with Gloo and NCCL).

Setup is ``InaHookState.from_env`` (the comm hook's, shared): every rank binds a UDP
socket facing the switch, the ranks exchange addresses (through the store), rank 0
installs the job on the switch, and all ranks agree whether the switch answers and holds
the job. Options come from ``InaOptions`` (``pg_options=InaOptions(...)``) or the
environment, which overrides them, as for the hook: INA_SWITCH (ip:port, required),
INA_JOB, INA_MODE (reliable|bounded), INA_ELEMENTS, INA_WINDOW, INA_DEADLINE_MS,
INA_FALLBACK (raise|gloo), INA_PRECISION (32|16|8, docs/precision.md), INA_DTYPES
(convert|strict), INA_STATIC_JOB (1: the job is in
the switch's table already, as on the FPGA; rank r binds INA_PORT + r; INA_SESSION gives
the session id of that job), INA_STAGE_BYTES.

Errors, one line each: no switch answers (raised at init unless INA_FALLBACK=gloo, which
warns and runs every all_reduce on Gloo), job not installed (JobNotInstalled), world size
above the switch's 32 members (WorldTooLarge, at init), dtype refused (strict only).
Subgroups (``dist.new_group``) are switch jobs of their own: job = INA_JOB + the
group's index.

A crashed run's job id: a torchrun restart (``--max-restarts``) takes it back at once
(the run's tag is in the session id, ``take_back``), and so does any run with
INA_TAKEOVER=1; the crashed run's DATA and RESULTs never reach the new session. Sparse
tensors go to Gloo; every strided layout (transposed, permuted, views) and tensors in a
graph (``create_graph=True``) are reduced by value, in place. ``dist.monitored_barrier``
is refused by torch for a backend not named gloo: ``monitored_barrier`` here runs it
on the inner Gloo group.

GPU tensors are staged through pinned host buffers (``host.ddp.staging``), overlapped
with the wire; CPU tensors are reduced zero-copy, the result written in place.
"""

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from dataclasses import dataclass, fields
import multiprocessing.util as mp_util
import os
import socket
import threading
import warnings
import weakref
import zlib

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup, ReduceOp
from torch._C._distributed_c10d import ProcessGroupGloo, PrefixStore, AllreduceOptions

from ina_fabric.protocol.fields import MAX_WORKERS

from ..transport.switch_client import SwitchClient, SwitchUnavailable
from .hook import InaHookState, JobNotInstalled, STAGE_BYTES, link_towards
from .staging import (CudaDevice, SimDevice, PinnedPool, StagedCall, reduce_host,
                      stage_chunks, contiguous_float32, _write_result)

__all__ = ["BACKEND", "InaOptions", "ProcessGroupIna", "InaWork", "WorldTooLarge",
           "JobNotInstalled", "monitored_barrier", "run_session", "take_back", "register"]

BACKEND = "ina"
_SWITCH_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: all_reduce calls whose sizes are checked across ranks by default: the first ones, where
#: a rank with another model or another tensor shows; every call costs one small Gloo
#: allreduce (1-6 ms with 4 ranks on two shared cores, as much as a 4 MB call itself)
CHECK_SIZES_CALLS = 8


class WorldTooLarge(ValueError):
    """More ranks than a switch job has members."""


@dataclass
class InaOptions:
    """Options of the ``ina`` backend (``init_process_group("ina", pg_options=...)``).
    None: the environment variable, else the default. The environment overrides."""
    switch: str | None = None        # INA_SWITCH ip:port
    job: int | None = None           # INA_JOB (1)
    mode: str | None = None          # INA_MODE: reliable | bounded
    elements: int | None = None      # INA_ELEMENTS per packet (the link's: 16368 on loopback)
    window: int | None = None        # INA_WINDOW
    deadline_ms: float | None = None  # INA_DEADLINE_MS (bounded mode)
    fallback: str | None = None      # INA_FALLBACK: raise (default) | gloo
    dtypes: str | None = None        # INA_DTYPES: convert (default) | strict
    static_job: bool | None = None   # INA_STATIC_JOB: 1 = the switch has the job already
    stage_bytes: int | None = None   # INA_STAGE_BYTES per switch call (default: the link's)
    #: INA_CHECK_SIZES: how many all_reduce calls (from the first) have their sizes
    #: checked across ranks before sending (default 8; "all" or -1: every call; 0: none)
    check_sizes: int | None = None
    #: INA_TAKEOVER: 1 = rank 0 takes the job id over from whatever run holds it (a run
    #: started again after a crash, outside torchrun's restarts, which take it back
    #: without this)
    takeover: bool | None = None
    #: INA_PRECISION (issue 40, docs/precision.md): the wire width of all_reduce (32, 16,
    #: 8; optionally ":stochastic", ":hadamard"); ``set_precision`` on the group's
    #: ``state`` changes it later
    precision: object = None
    connect_timeout: float = 2.0     # seconds without any answer: switch unavailable
    device: str | None = None        # tests: "sim" stages CPU tensors like CUDA ones

    def resolved(self) -> "InaOptions":
        env = os.environ
        o = InaOptions(**{f.name: getattr(self, f.name) for f in fields(self)})
        if "INA_FALLBACK" in env:
            o.fallback = env["INA_FALLBACK"]
        if "INA_DTYPES" in env:
            o.dtypes = env["INA_DTYPES"]
        if "INA_STATIC_JOB" in env:
            o.static_job = env["INA_STATIC_JOB"] not in ("", "0")
        if "INA_CHECK_SIZES" in env:
            v = env["INA_CHECK_SIZES"].strip().lower()
            try:
                o.check_sizes = -1 if v == "all" else int(v or 0)
            except ValueError:
                raise ValueError(f"INA_CHECK_SIZES={v!r}: expected a number of calls, "
                                 f"all or 0") from None
        if o.check_sizes is None:
            o.check_sizes = CHECK_SIZES_CALLS
        if "INA_TAKEOVER" in env:
            o.takeover = env["INA_TAKEOVER"] not in ("", "0")
        o.takeover = bool(o.takeover)
        if "INA_STAGE_BYTES" in env:
            o.stage_bytes = int(env["INA_STAGE_BYTES"])
        o.fallback = o.fallback or "raise"
        o.dtypes = o.dtypes or "convert"
        o.static_job = bool(o.static_job)
        if o.fallback not in ("raise", "gloo"):
            raise ValueError(f"INA: fallback {o.fallback!r}: expected raise or gloo")
        if o.dtypes not in ("convert", "strict"):
            raise ValueError(f"INA: dtypes {o.dtypes!r}: expected convert or strict")
        return o


def run_tag(env=None) -> int | None:
    """The launcher's run as 32 bits, or None outside torchrun: a hash of torchrun's run
    id (``--rdzv-id``), or, for its default id ("none"), of the host and the agent process
    (every worker's parent, the same across ``--max-restarts``)."""
    env = os.environ if env is None else env
    run = env.get("TORCHELASTIC_RUN_ID")
    if run is None:
        return None
    if run in ("", "none"):
        run = f"{socket.gethostname()}/{os.getppid()}"
    return zlib.crc32(f"ina-run:{run}".encode())


def run_session(env=None) -> int:
    """A fresh session id for rank 0's install: 64 random bits outside torchrun; under
    it, the run's tag (``run_tag``) in the upper 32 bits and 32 random bits below, so a
    restarted attempt knows its predecessor's install, and no two attempts share one."""
    from ina_fabric.protocol.jobtable import new_session
    tag = run_tag(env)
    fresh = new_session()
    return fresh if tag is None else (tag << 32) | (fresh & 0xFFFFFFFF or 1)


def take_back(switch, job: int, session: int, takeover: bool = False,
              timeout: float = 2.0):
    """Rank 0, before it installs ``job`` under ``session``: free the id when the run
    that holds it is this run's previous attempt (the same run tag: a torchrun restart
    after a crash, or the same ``--rdzv-id`` started again), or any run when
    ``takeover`` (INA_TAKEOVER=1, a key holder's explicit choice). The removal names the
    session it removes, so a run that installed in between is never touched; the new
    install starts with fresh slots under a new session, so nothing of the crashed run
    (its DATA still in flight, its RESULTs) reaches the new one: the switch drops DATA of
    another session (``drop_bad_session``), the client RESULTs of another session. A
    job held by another run, without ``takeover``, is left alone (the install is then
    refused: "taken by another run"). Returns the session taken back, or None."""
    from ina_fabric.host.switch import query_status, remove_job, JobRefused
    from .hook import switch_from_env
    try:
        addr = switch_from_env(switch and f"{switch[0]}:{switch[1]}")
        addr = (socket.gethostbyname(addr[0]), addr[1])
        held = query_status(addr, timeout=min(timeout, 1.0))["jobs"].get(str(job))
    except (OSError, ValueError):     # no switch, or a bad address: from_env says so
        return None
    if not held or "session" not in held:
        return None
    old = int(held["session"], 16)
    same_run = run_tag() is not None and old >> 32 == session >> 32
    if old == session or not (same_run or takeover):
        return None
    try:
        remove_job(addr, job, old, timeout=min(timeout, 1.0))
    except (OSError, JobRefused):     # gone or replaced meanwhile: the install decides
        return None
    why = "this run's previous attempt" if same_run else "INA_TAKEOVER=1"
    warnings.warn(f"INA: job {job}: took the id back from session {old:016x} ({why}); "
                  f"its slots and results are gone, the new session is {session:016x}",
                  RuntimeWarning, stacklevel=3)
    return old


class _GlooPeers:
    """``DistPeers`` for a group that torch.distributed does not know yet: addresses
    through the group's store, agreement and fallback on its inner Gloo group."""

    def __init__(self, store, gloo, rank, world):
        self.store, self.gloo, self.rank, self.world = store, gloo, rank, world

    def gather(self, text):
        self.store.set(f"ina/addr/{self.rank}", text)
        return [self.store.get(f"ina/addr/{r}").decode() for r in range(self.world)]

    def agree(self, ok):
        flag = torch.tensor([ok], dtype=torch.int32)
        opts = AllreduceOptions()
        opts.reduceOp = ReduceOp.MIN
        self.gloo.allreduce([flag], opts).wait()
        return int(flag.item())

    def allreduce(self, tensor):
        self.gloo.allreduce([tensor]).wait()


class InaWork(dist.Work):
    """The Work of one all_reduce: ``wait()`` blocks until the result is in the tensors
    (for CUDA tensors: queued on their streams) and raises the call's error, if any;
    ``get_future()`` is what DDP chains on."""

    def __init__(self, fut):
        super().__init__()
        self._fut = fut

    def wait(self, timeout=None):
        self._fut.wait()
        return True

    def get_future(self):
        return self._fut

    def is_completed(self):
        return self._fut.done()

    def is_success(self):
        if not self._fut.done():
            return False
        try:
            self._fut.value()
            return True
        except Exception:
            return False

    def result(self):
        return self._fut.value()


class ProcessGroupIna(ProcessGroup):
    """The ``ina`` process group (see the module docstring)."""

    def __init__(self, store, rank, world, timeout, options: InaOptions | None = None,
                 group_index: int = 0):
        super().__init__(rank, world)
        o = (options or InaOptions()).resolved()
        if world > MAX_WORKERS:
            raise WorldTooLarge(
                f"INA: world size {world} is above the switch's limit of {MAX_WORKERS} "
                f"members per job; use gloo/nccl for this job (or a group of at most "
                f"{MAX_WORKERS} ranks)")
        self.options = o
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
        if attempt and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            # torchrun's agent keeps one store across its restarts, and the crashed
            # attempt's keys stay in it: Gloo would connect to the dead ranks' ports
            # (plain Gloo fails so, torch issues 135712 and 167288). Each attempt's
            # keys go under a prefix of their own.
            store = PrefixStore(f"ina-attempt{attempt}/", store)
        self._store = store
        self._timeout = timeout
        self.gloo = ProcessGroupGloo(PrefixStore("gloo/", store), rank, world, timeout)
        # the size agreement's own Gloo group, used on the wire thread only (so its
        # calls can never interleave with the caller's delegated collectives)
        self._sizes = ProcessGroupGloo(PrefixStore("ina-sizes/", store), rank, world,
                                       timeout) if o.check_sizes and world > 1 else None
        self._checks_left = o.check_sizes     # -1: every call
        for dev in ("cpu", "cuda"):   # every collective not overridden here: Gloo
            self._register_backend(torch.device(dev), ProcessGroup.BackendType.GLOO,
                                   self.gloo)
        self._set_default_backend(ProcessGroup.BackendType.GLOO)
        switch = None
        if o.switch:
            host, _, port = o.switch.rpartition(":")
            switch = (host, int(port)) if port.isdigit() else None
            if switch is None:
                raise ValueError(f"bad switch address {o.switch!r}: expected ip:port")
        session = None
        if not o.static_job:
            session = run_session()
            if rank == 0:
                take_back(switch, int(os.environ.get("INA_JOB", o.job or 1)) + group_index,
                          session, o.takeover, o.connect_timeout)
        self.state = InaHookState.from_env(
            None, switch=switch, job=o.job, job_offset=group_index, mode=o.mode,
            session=session,
            window=o.window,
            elements=o.elements,
            deadline=o.deadline_ms / 1e3 if o.deadline_ms is not None else None,
            configure=not o.static_job, connect_timeout=o.connect_timeout,
            peers=_GlooPeers(store, self.gloo, rank, world), average=False,
            fallback_to_gloo=o.fallback == "gloo", precision=o.precision)
        self.state.exchange_rto = False    # the wire thread may not use self.gloo
        client = self.state.collective
        # per switch call: INA_STAGE_BYTES, else the link's (hook.STAGE_BYTES: 64 MiB on
        # loopback, where fewer, larger calls win; 4 MiB on Ethernet)
        stage = o.stage_bytes or STAGE_BYTES[link_towards(client.switch)]
        self.chunk = max(1, stage // 4 // client.elements) * client.elements
        if self.state.installed:
            # (multiprocessing's exit hook, not atexit: it runs in the main process at
            # exit and in a multiprocessing child, which ends with os._exit)
            mp_util.Finalize(None, _remove_at_exit, (weakref.ref(self),), exitpriority=1)
        self._wire = ThreadPoolExecutor(1, thread_name_prefix="ina-wire")
        self._devices = {}
        self._pools = {}
        self._lock = threading.Lock()
        self._warned = set()

    # -- torch.distributed interface ---------------------------------------------
    def getBackendName(self):
        return BACKEND

    @property
    def use_switch(self) -> bool:
        return self.state.use_switch

    def allreduce(self, tensors, opts=None):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        op = opts.reduceOp if opts is not None else ReduceOp.SUM
        # (== compares a ReduceOp with the enum; `in` would test identity first)
        if not (op == ReduceOp.SUM or op == ReduceOp.AVG) or not self.use_switch or \
                not all(self._carried(t) for t in tensors):
            return self._delegate(tensors, op)
        divide = self.size() if op == ReduceOp.AVG else 1
        staged = []
        for t in tensors:           # on the caller's thread: queue the device copies
            dev = self._device(t)
            staged.append(t if dev is None else StagedCall(dev, self._pool(dev), t, self.chunk))
        calls = [c for c in staged if isinstance(c, StagedCall)]
        one = calls[0] if calls and len({t.device for t in tensors}) == 1 else None
        fut = one.device.future() if one else torch.futures.Future()

        def run():
            try:
                self._agree_sizes(tensors)
                done = []
                for item in staged:
                    if isinstance(item, StagedCall):
                        done.append((item.device, item.run(self._reduce, divide)))
                    else:
                        self._reduce_cpu(item, divide)
                if one is not None:    # the tensors' stream, then the future
                    one.device.complete(fut, list(tensors), one.stream)
                    return
                for dev, ev in done:   # mixed devices: the host waits for the copies
                    if ev is not None:
                        dev.wait(ev)
                fut.set_result(list(tensors))
            except BaseException as e:   # surfaces in wait() / backward()
                fut.set_exception(e)

        self._wire.submit(run)
        return InaWork(fut)

    def shutdown(self):
        self._wire.shutdown(wait=True)
        self.state.close(remove=self._all_done())
        for d in self._devices.values():
            if isinstance(d, SimDevice):
                d.close()
        if self._sizes is not None:
            # the size group is ours, not registered with the ProcessGroup: stop its
            # threads here rather than in a destructor at interpreter exit
            self._sizes.shutdown()
            self._sizes = None
        try:
            super().shutdown()
        except Exception:  # older/newer torch: nothing more to shut down
            pass

    def _agree_sizes(self, tensors):
        """Every rank's all_reduce must carry the same element counts: a call of
        another size sends another number of datagrams, and from then on the ranks'
        sequence numbers would name different chunks. Before anything is sent, the
        ranks compare (count, total, CRC of the sizes) with one MAX of the values and
        their negatives on the size group (equal on every rank exactly when MAX = -MAX
        of the negatives); on a mismatch every rank raises the same one-line error and
        the job stays in step. One small Gloo allreduce per checked call: the first
        ``INA_CHECK_SIZES`` calls (default 8, where a rank with another model or
        tensor shows; "all": every call, at 1-6 ms each with 4 ranks here). An unchecked
        mismatch stalls (reliable) or gives partial results (bounded), and the calls
        after it raise JobFailed."""
        if self._sizes is None or self._checks_left == 0:
            return
        self._checks_left -= self._checks_left > 0
        sizes = [t.numel() for t in tensors]
        mine = [len(sizes), sum(sizes), zlib.crc32(repr(sizes).encode())]
        v = torch.tensor(mine + [-x for x in mine], dtype=torch.int64)
        opts = AllreduceOptions()
        opts.reduceOp = ReduceOp.MAX
        self._sizes.allreduce([v], opts).wait()
        hi, lo = v[:3].tolist(), [-x for x in v[3:].tolist()]
        if hi != lo:
            raise ValueError(
                f"INA: all_reduce sizes differ across ranks (this rank, {self.rank()}: "
                f"{sizes[0] if len(sizes) == 1 else sizes} elements; the ranks' totals "
                f"range {lo[1]}..{hi[1]}); nothing was sent, every rank raises this")

    def _all_done(self, wait=timedelta(seconds=5)) -> bool:
        """Each rank says through the store that it is done with the job; the rank
        that installed it waits (at most ``wait``) until every rank has, and only then
        may remove it from the switch. A rank that never says so (crashed, or still
        running) leaves the job in place: the switch frees its id after its idle
        reclaim time."""
        try:
            self._store.set(f"ina/done/{self.rank()}", "1")
            if self.state.installed:
                self._store.wait([f"ina/done/{r}" for r in range(self.size())], wait)
            return True
        except Exception:  # noqa: BLE001 (store gone, or a rank not done in time)
            return False

    # -- everything else: the inner Gloo group, called from Python ------------------
    # Each is forwarded explicitly instead of left to c10d's dispatch. Through the
    # dispatch, a collective on this (Python) process group enters Gloo's enqueue with
    # the GIL held; a Gloo worker thread that finishes the previous work frees Python
    # tensors under Gloo's queue lock and waits for the GIL: a deadlock (seen in 2 of 12
    # runs of tests/backend_ranks.py, in broadcast and barrier). ProcessGroupGloo's
    # bindings release the GIL before they enqueue.
    def _forward(name):
        def op(self, *args, **kwargs):
            return getattr(self.gloo, name)(*args, **kwargs)
        op.__name__ = name
        op.__doc__ = f"``{name}`` on the inner Gloo group."
        return op

    for _name in ("broadcast", "allgather", "_allgather_base", "allgather_coalesced",
                  "reduce", "reduce_scatter", "_reduce_scatter_base", "gather", "scatter",
                  "alltoall", "alltoall_base", "barrier", "send", "recv", "recv_anysource",
                  "monitored_barrier", "allreduce_coalesced"):
        locals()[_name] = _forward(_name)
    del _forward, _name

    # -- routing -----------------------------------------------------------------
    def _carried(self, t: torch.Tensor) -> bool:
        """Whether the switch carries ``t``; refuse (strict) or say so once (float64)."""
        if t.layout != torch.strided:     # sparse (COO, CSR, ...): Gloo, as it is
            return False
        if t.dtype in _SWITCH_DTYPES and t.device.type in ("cpu", "cuda"):
            if t.dtype != torch.float32 and self.options.dtypes == "strict":
                raise TypeError(f"INA: all_reduce of {t.dtype} refused (INA_DTYPES=strict); "
                                f"the switch carries float32 (INA_DTYPES=convert converts "
                                f"fp16/bf16 to float32 for the wire)")
            return True
        if self.options.dtypes == "strict":
            raise TypeError(f"INA: all_reduce of {t.dtype} on {t.device.type} refused "
                            f"(INA_DTYPES=strict); the switch carries float32 fixed point "
                            f"(INA_DTYPES=convert sends such tensors to Gloo, exactly)")
        if t.dtype == torch.float64 and "float64" not in self._warned:
            self._warned.add("float64")
            warnings.warn("INA: float64 all_reduce runs on Gloo (exact); the switch "
                          "carries float32: pass float32 tensors to use it",
                          RuntimeWarning, stacklevel=4)
        return False

    def _delegate(self, tensors, op):
        """Gloo, with AVG (which Gloo lacks) as SUM then divide."""
        if op != ReduceOp.AVG:
            o = AllreduceOptions()
            o.reduceOp = op
            return self.gloo.allreduce(tensors, o)
        work = self.gloo.allreduce(tensors)
        world = self.size()

        def divide(_):
            for t in tensors:
                if t.is_floating_point() or t.is_complex():
                    t.div_(world)
                else:
                    t.floor_divide_(world)
            return list(tensors)

        return InaWork(work.get_future().then(divide))

    def _device(self, t):
        if t.device.type == "cuda":
            key = ("cuda", t.device.index)
            with self._lock:
                if key not in self._devices:
                    self._devices[key] = CudaDevice(t.device)
                return self._devices[key]
        if self.options.device == "sim":
            with self._lock:
                if "sim" not in self._devices:
                    self._devices["sim"] = SimDevice()
                return self._devices["sim"]
        return None

    def _pool(self, dev):
        with self._lock:
            if id(dev) not in self._pools:
                self._pools[id(dev)] = PinnedPool(dev)
            return self._pools[id(dev)]

    # -- on the wire thread ------------------------------------------------------
    def _reduce(self, arr, in_place=False):
        """One switch call on a float32 host array; the sum (``arr`` itself when
        ``in_place``). A call that gets no answer: Gloo for this and every later call
        (INA_FALLBACK=gloo), or one line saying whether the switch is down or lacks the
        job (no RESULT came, so ``arr`` is as it was)."""
        state = self.state
        if state.use_switch:
            try:
                return state.reduce_array(
                    arr, in_place and isinstance(state.collective, SwitchClient))
            except SwitchUnavailable as e:
                state.fallbacks += 1
                if state.fallback_to_gloo:
                    state._fall_back(str(e))
                else:
                    err = state.diagnose(e)
                    raise type(err)(f"INA: {err}; not falling back to Gloo "
                                    f"(INA_FALLBACK=gloo allows it)") from None
        t = torch.from_numpy(arr).clone()
        self.gloo.allreduce([t]).wait()
        return t.numpy()

    def _reduce_cpu(self, t, divide):
        # the values, not the graph: a DDP bucket under backward(create_graph=True), or
        # a non-leaf that requires grad, is written in place as Gloo writes it
        t = t.detach()
        if t.dtype == torch.float32 and t.is_contiguous():
            # zero-copy: each stage chunk (cut as for any device, so all ranks make the
            # same calls) is summed in place in the tensor's memory; no output array
            arr = t.view(-1).numpy()
            for a, b in stage_chunks(arr.size, self.chunk):
                view = arr[a:b]
                out = self._reduce(view, in_place=True)
                if out is not view or divide > 1:
                    _write_result(view, out, divide)
        else:
            # one float32 contiguous copy of any other layout (transposed, permuted,
            # strided, fp16/bf16), summed, copied back through the tensor's own strides
            work = contiguous_float32(t)
            reduce_host(work.view(-1), self.chunk, self._reduce, divide)
            t.copy_(work.view(t.shape))


def _remove_at_exit(ref):
    """At interpreter exit, the rank that installed a job it has not removed (the
    process ends without ``destroy_process_group``: ``sys.exit`` in a script or a
    skipped test) removes it, under its own session: the job cannot go on without this
    rank, and left installed it holds its slot memory on the switch (a software switch
    refuses new jobs once 1 GiB is held: "N B of slot memory, but only M B ... are
    free"). A crash that ends the process at once still leaves it: the next attempt
    takes the id back (``take_back``)."""
    pg = ref()
    if pg is None or not pg.state.installed:
        return
    from ina_fabric.host.switch import remove_job
    c = pg.state.collective
    pg.state.installed = False
    try:
        remove_job(c.switch, c.job, c.session, timeout=0.5)
    except Exception:  # noqa: BLE001 (switch gone: nothing is held there)
        pass


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """``dist.monitored_barrier`` for an ``ina`` group: on its inner Gloo group.

    torch refuses ``dist.monitored_barrier`` for a group whose backend is not named
    gloo ("monitored_barrier is only implemented for GLOO backend", a check on the
    backend's name in ``distributed_c10d``), so it never reaches this group's
    ``monitored_barrier``. This runs the same Gloo barrier, with the same reporting
    (the ranks that did not come, by number), on the group's inner Gloo group. Any other
    group goes to ``dist.monitored_barrier``."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(pg, ProcessGroupIna):
        return dist.monitored_barrier(group, timeout, wait_all_ranks)
    if timeout is None:
        timeout = pg._timeout
    return pg.gloo.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)


def _create(dist_opts, pg_options):
    """The backend's creator (``extended_api``): one ``ProcessGroupIna`` per group."""
    name = str(dist_opts.group_id or "0")
    index = int(name) if name.isdigit() else zlib.crc32(name.encode()) % 1000 + 1
    return ProcessGroupIna(dist_opts.store, dist_opts.group_rank, dist_opts.group_size,
                           dist_opts.timeout, pg_options, group_index=index)


def register():
    """Register ``ina`` with torch.distributed (idempotent; importing
    ``ina_fabric.distributed`` does it)."""
    if getattr(dist.Backend, BACKEND.upper(), None) == BACKEND and \
            BACKEND.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND, _create, extended_api=True,
                                  devices=["cpu", "cuda"])


register()
