"""A DDP communication hook that sends each gradient bucket through a switch.

In the shape of ``torch.distributed.algorithms.ddp_comm_hooks``::

    state = setup_hook_state(process_group)   # or InaHookState(collective, group)
    model.register_comm_hook(state, ina_hook)

Any bucket count and size works: each bucket is one ``allreduce`` call on the collective
(a ``SwitchClient`` or anything with ``allreduce(np.ndarray) -> (np.ndarray, stats)``),
run on one background thread per rank, in bucket order, so backward computation goes on
while a bucket is on the wire. If no switch answers at setup, every rank falls back to
Gloo allreduce together with a warning, or every rank raises (``fallback_to_gloo``,
INA_FALLBACK=gloo|never; see ``InaHookState.probe``). A switch lost mid-run ends every
rank with its reason: a rank alone on Gloo would pair its calls with nobody's.
"""

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
import os
import socket
import threading
import warnings

import numpy as np
import torch
import torch.distributed as dist

from ina_fabric.protocol.jobtable import job_defaults

from ..transport.switch_client import (SwitchClient, SwitchUnavailable, AllreduceStats,
                                      AllreduceTooLate)
from .. import oneline

__all__ = ["InaHookState", "setup_hook_state", "HookSettings", "hook_settings",
           "link_towards", "STAGE_BYTES", "bind_client", "exchange_addresses", "install_job", "ina_hook",
           "switch_from_env", "local_address_towards", "DistPeers", "JobNotInstalled"]


oneline.install()      # an uncaught INA error: one line per rank (INA_DEBUG=1: traceback)


class JobNotInstalled(SwitchUnavailable):
    """The switch answers, but the job is not in its job table."""


class DistPeers:
    """The ranks of a torch.distributed process group, as far as ``InaHookState`` needs
    them: rank and size, an all-gather of strings (the members' addresses), agreement
    (the minimum of a flag over ranks) and the fallback allreduce. The ``ina`` backend
    passes its own (over its inner Gloo group, before the group exists in
    torch.distributed); anything with the same five members works."""

    def __init__(self, group=None):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)

    def gather(self, text: str) -> list:
        members = [None] * self.world
        dist.all_gather_object(members, text, group=self.group)
        return members

    def agree(self, ok: int) -> int:
        flag = torch.tensor([ok], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
        return int(flag.item())

    def allreduce(self, tensor: torch.Tensor):
        dist.all_reduce(tensor, group=self.group)


def local_address_towards(addr) -> str:
    """The local IP this host uses to reach ``addr`` (no packet is sent)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(addr)
        return s.getsockname()[0]
    finally:
        s.close()


def local_mac(ip: str) -> str | None:
    """The MAC of the interface in this namespace that holds ``ip``, or None (loopback,
    or no such interface). A member's job-table entry carries it: a switch in hardware
    (the board) addresses its RESULT frames to it, as it has no ARP client of its own."""
    import fcntl
    import struct
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _, name in socket.if_nameindex():
            req = struct.pack("256s", name.encode()[:15])
            try:   # SIOCGIFADDR, SIOCGIFHWADDR (ioctls: this namespace's, unlike /sys)
                if socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, req)[20:24]) != ip:
                    continue
                hw = fcntl.ioctl(s.fileno(), 0x8927, req)[18:24]
            except OSError:
                continue
            return None if not any(hw) else ":".join(f"{b:02x}" for b in hw)
        return None
    finally:
        s.close()


def switch_from_env(default=None, env=None):
    """``INA_SWITCH=ip:port`` (or the default), parsed; ValueError with a clear message."""
    text = (os.environ if env is None else env).get("INA_SWITCH", default)
    if not text:
        raise ValueError("no switch address: set INA_SWITCH=ip:port or pass switch=")
    host, sep, port = str(text).rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad switch address {text!r}: expected ip:port")
    return host, int(port)


@dataclass(frozen=True)
class HookSettings:
    """What the environment and the arguments say about this rank's job, read once (no
    sockets). The environment overrides each argument; unset, the defaults of the link
    towards the switch (``LINK_DEFAULTS["loopback"]`` when the switch is on this host's
    loopback, ``"ethernet"`` otherwise): see :func:`hook_settings`."""
    switch: tuple
    link: str
    job: int
    mode: str
    window: int
    elements: int
    deadline: float | None      # seconds; with ``auto``, the derived rule's first value
    auto: bool                  # bounded mode's slot deadline derived (``host.deadline``)
    rule: str
    link_rate: float | None     # INA_LINK_RATE, bit/s
    pace_rate: float            # INA_PACE_RATE (else INA_LINK_RATE), bit/s; 0: none
    carry: bool
    bind_base: int              # INA_PORT: rank r binds base + r (0: any port)
    session: object             # INA_SESSION (a static job's), else None
    fallback: bool | None       # INA_FALLBACK: gloo -> True, raise -> False
    worker: int | None = None   # INA_WORKER: the id at its own switch (a tree's leaf)
    congestion: str = "aimd"    # INA_CONGESTION: aimd | delay | off (SwitchClient.congestion)
    #: INA_PRECISION (issue 40, docs/precision.md): the calls' width on the wire,
    #: rounding and rotation (``host.transport.precision.Precision``)
    precision: object = None
    #: INA_ENGINE: the client's call loop, ``auto`` (the compiled one where built), ``c``
    #: or ``python`` (``SwitchClient.engine``)
    engine: str = "auto"
    #: INA_LOCAL_QUEUE: bytes a worker may keep in its host's queue
    #: (``SwitchClient.local_queue``; None: TCP's share, docs/congestion.md)
    local_queue: int | None = None
    #: INA_GSO: auto, on or off: the compiled loop sends runs of datagrams as UDP GSO
    #: sends (``SwitchClient.gso``)
    gso: str = "auto"


#: bytes per switch call when the ``ina`` backend splits a tensor (``INA_STAGE_BYTES``), by
#: link: on loopback the per-call cost dominates (64 MiB: 0.93x Gloo at 64 MB, 4 MiB:
#: 1.19x, issue 42); on Ethernet a call's staging stays small
STAGE_BYTES = {"loopback": 64 << 20, "jumbo": 4 << 20, "ethernet": 4 << 20}


def link_towards(switch) -> str:
    """``"loopback"`` when the switch is on this host's loopback, else ``"ethernet"``:
    the link whose defaults (elements per packet, staging) a job takes unless told."""
    import ipaddress
    try:
        return "loopback" if ipaddress.ip_address(switch[0]).is_loopback else "ethernet"
    except ValueError:
        return "ethernet"


def hook_settings(env=None, switch=None, job=None, mode=None, window=None, elements=None,
                  deadline=None, bind_port=None, job_offset=0, session=None, carry=False,
                  deadline_rule=None, precision=None) -> HookSettings:
    """Read INA_SWITCH (ip:port), INA_JOB (default 1), INA_MODE
    (reliable|bounded|bounded-skip), INA_CARRY (1: a bounded worker's left-out
    contribution goes with its next call, ``SwitchClient.carry``), INA_ELEMENTS (per
    packet), INA_WINDOW, INA_DEADLINE_MS (milliseconds, as every flag and TOML key;
    ``auto``, or ``deadline="auto"``: bounded mode's slot deadline derived from the link
    and the ranks' timeouts, ``host.deadline``), INA_DEADLINE_RULE (or ``deadline_rule``:
    ``loss-aware``, the default, or ``derived``), INA_LINK_RATE (bit/s of the workers'
    links: the derived deadline's, and the pacing rate), INA_PACE_RATE (bit/s, overrides
    the pacing rate; 0: none), INA_PORT, INA_SESSION, INA_FALLBACK (gloo|raise) and
    INA_WORKER (the worker's id at its switch: its index at its leaf in a tree of
    switches, docs/fabric.md; default the rank), INA_CONGESTION (``aimd``, the default,
    ``delay`` or ``off``: ``SwitchClient.congestion``), INA_PRECISION (or ``precision``:
    ``32``, ``16``, ``8``, optionally ``:stochastic`` and/or ``:hadamard``;
    docs/precision.md), INA_ENGINE (``auto``, ``c`` or ``python``: the call loop,
    ``SwitchClient.engine``), INA_LOCAL_QUEUE (bytes a worker may keep in its host's
    queue, ``SwitchClient.local_queue``), INA_GSO (``auto``, ``on`` or ``off``: runs of
    datagrams as UDP GSO sends, ``SwitchClient.gso``).
    ValueError with a one-line reason on a bad value."""
    from ina_fabric.protocol.jobtable import parse_session
    from ..deadline import RULES, slot_deadline
    from ina_fabric.protocol.fields import HEADER_BYTES
    env = os.environ if env is None else env
    addr = switch_from_env(switch and f"{switch[0]}:{switch[1]}", env)
    try:
        addr = (socket.gethostbyname(addr[0]), addr[1])
    except OSError as e:
        raise ValueError(f"bad switch address {addr[0]}:{addr[1]}: {e}") from None
    link = link_towards(addr)
    # the slot deadline: INA_DEADLINE_MS (a number, or "auto"), else ``deadline``
    # (seconds, or "auto"); "auto" in bounded mode derives it (host.deadline): installed
    # for the job's window, moved live from the first call on (InaHookState.tune_deadline)
    text = env.get("INA_DEADLINE_MS", "").strip().lower()
    auto = text == "auto" or (not text and deadline == "auto")
    fixed = float(text) / 1e3 if text and not auto else \
        (None if auto or deadline == "auto" else deadline)
    s = job_defaults(
        link,
        elements=int(env["INA_ELEMENTS"]) if "INA_ELEMENTS" in env else elements,
        window=int(env["INA_WINDOW"]) if "INA_WINDOW" in env else window,
        mode=env.get("INA_MODE", mode), deadline=fixed)
    auto = auto and s.mode in ("bounded", "bounded-skip")
    link_rate = float(env["INA_LINK_RATE"]) if env.get("INA_LINK_RATE") else None
    rule = env.get("INA_DEADLINE_RULE", "").strip() or deadline_rule or "loss-aware"
    if auto and rule not in RULES:
        raise ValueError(f"INA_DEADLINE_RULE={rule!r}: have {', '.join(RULES)}")
    d = slot_deadline(s.window, HEADER_BYTES + 4 * s.elements, link_rate) if auto \
        else s.deadline
    pace = env.get("INA_PACE_RATE", env.get("INA_LINK_RATE", "")).strip()
    fallback = {"gloo": True, "raise": False, "never": False}.get(env.get("INA_FALLBACK"))
    if "INA_SESSION" in env or session:
        session = parse_session(env.get("INA_SESSION", session))
    return HookSettings(
        switch=addr, link=link, job=int(env.get("INA_JOB", job or 1)) + job_offset,
        mode=s.mode, window=s.window, elements=s.elements, deadline=d, auto=auto,
        rule=rule, link_rate=link_rate, pace_rate=float(pace) if pace else 0.0,
        carry=env.get("INA_CARRY", "1" if carry else "0") == "1",
        bind_base=int(env.get("INA_PORT", bind_port or 0)), session=session,
        fallback=fallback,
        worker=int(env["INA_WORKER"]) if env.get("INA_WORKER") else None,
        congestion=env.get("INA_CONGESTION", "aimd").strip() or "aimd",
        precision=_precision_setting(env, precision),
        engine=_engine_setting(env),
        local_queue=_local_queue_setting(env),
        gso=_gso_setting(env))


def _gso_setting(env):
    text = env.get("INA_GSO", "").strip().lower() or "auto"
    if text not in ("auto", "on", "off"):
        raise ValueError(f"INA_GSO={text!r}: expected auto, on or off")
    return text


def _local_queue_setting(env):
    text = env.get("INA_LOCAL_QUEUE", "").strip()
    if not text:
        return None
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 4096:
        raise ValueError(f"INA_LOCAL_QUEUE={text!r}: bytes, at least 4096")
    return n


def _engine_setting(env):
    text = env.get("INA_ENGINE", "").strip() or "auto"
    if text not in ("auto", "c", "python"):
        raise ValueError(f"INA_ENGINE={text!r}: expected auto, c or python")
    return text


def _precision_setting(env, precision):
    """INA_PRECISION over ``precision``; ValueError naming the variable on a bad one."""
    from ..transport.precision import as_precision
    text = env.get("INA_PRECISION", "").strip()
    try:
        return as_precision(text if text else precision)
    except ValueError as e:
        raise ValueError(f"INA_PRECISION={text!r}: {e}" if text else str(e)) from None


class InaHookState:
    """The state of the INA comm hook on one rank: what it reduces through, how it falls
    back, the derived slot deadline's tuner and the statistics. It does no I/O when
    built (torch's ``PowerSGDState`` habit): :func:`setup_hook_state` (also
    ``InaHookState.from_env``) reads the environment, binds the socket, exchanges the
    ranks' addresses, installs the job and probes the switch, then builds one.

    ``collective``: a ``SwitchClient``, or anything with ``allreduce(np.ndarray) ->
    (np.ndarray, stats)``; ``average``: divide the sum by the world size (DDP's
    gradients); ``fallback_to_gloo``: warn and use Gloo when no switch answers (else
    raise); ``peers``: how the ranks talk besides (default ``DistPeers(process_group)``).
    """

    __slots__ = (
        # what a bucket goes through, and with whom
        "collective", "process_group", "peers",
        # behaviour
        "average", "fallback_to_gloo", "use_switch", "status_timeout",
        # the job as installed by this rank (rank 0, ``configure``): ``close()`` removes it,
        # and ``tune_deadline`` moves its deadline live
        "installed", "job_config",
        # bounded mode's derived slot deadline (``host.deadline.SlotDeadlineTuner``; None:
        # a fixed deadline). ``exchange_rto``: exchange the ranks' timeouts over ``peers``
        # (the ``ina`` backend turns it off: its wire thread may not use the caller's Gloo
        # group; rank 0's own is used)
        "tuner", "exchange_rto", "_refetched_at_exchange",
        # statistics
        "fallbacks", "stats", "comm_seconds", "bytes_sent", "max_abs_local",
        "extra_stats", "call_seconds",
        # the last bucket's error, if one failed (``raise_error``)
        "error",
        # the hook's one thread, made at the first bucket
        "_pool", "_lock",
        # bounded mode rides out a stall (``host.ddp.rejoin``): a call too late for good
        # marks this rank ``behind`` (its later buckets skip the switch) instead of
        # failing, and the training loop's ``Rejoin`` gives it a peer's replica
        "rejoin", "behind",
        # the buckets' precision (issue 40): None (the client's), or what
        # ``set_precision`` was given; and the bytes sent at each width
        "precision", "bytes_by_width",
    )

    def __init__(self, collective, process_group=None, average: bool = True,
                 fallback_to_gloo: bool = True, peers=None, status_timeout: float = 3.0):
        self.collective, self.process_group, self.peers = collective, process_group, peers
        #: seconds a STATUS request (the start-up probe) waits for its answer (a
        #: simulated board answers in simulated time: ``ina train --engine board``
        #: gives it longer)
        self.status_timeout = status_timeout
        self.average, self.fallback_to_gloo, self.use_switch = average, fallback_to_gloo, True
        self.installed, self.job_config = False, None
        self.tuner, self.exchange_rto, self._refetched_at_exchange = None, True, 0
        self.fallbacks, self.stats, self.comm_seconds = 0, AllreduceStats(), 0.0
        self.bytes_sent, self.max_abs_local = 0, 0.0   # largest |gradient| contributed
        self.extra_stats = {}      # summed numeric stats of other collectives
        self.call_seconds = []     # wall time of every allreduce call
        self.error = None
        self._pool, self._lock = None, threading.Lock()
        self.rejoin, self.behind = False, False
        self.precision, self.bytes_by_width = None, {}

    def set_precision(self, precision):
        """The precision of the buckets from now on (issue 40, docs/precision.md): a
        width (32, 16, 8), a string (``"int8:stochastic"``), a ``Precision``, None (the
        client's, INA_PRECISION), or a callable ``precision(bucket) -> any of those``,
        called for every DDP bucket (a ``torch.distributed.GradBucket``: ``index()``,
        ``buffer()``) at every step: how a controller sets it per bucket. Every rank must
        give the same bucket the same precision (a controller deciding on one rank
        broadcasts its choice), or the switch refuses the disagreeing DATA
        (``Refusal.BAD_WIDTH``) and the call fails on every rank."""
        from ..transport.precision import as_precision
        if precision is not None and not callable(precision):
            precision = as_precision(precision)
        self.precision = precision

    def precision_for(self, bucket=None):
        """The ``Precision`` of ``bucket`` (None: the state's fixed one, or the
        client's)."""
        from ..transport.precision import as_precision
        p = self.precision
        if callable(p):
            p = p(bucket)
        if p is None:
            return getattr(self.collective, "precision", None)
        return as_precision(p)

    @classmethod
    def from_env(cls, process_group=None, **kw) -> "InaHookState":
        """``setup_hook_state(process_group, ...)``: see there."""
        return setup_hook_state(process_group, **kw)

    @property
    def deadline_history(self) -> list:
        """(call, deadline) at the derived deadline's first value and every move."""
        return self.tuner.history if self.tuner is not None else []

    def raise_error(self, wrapped: BaseException):
        """Re-raise the error of a failed bucket (set by ``ina_hook``) in place of
        ``wrapped``, the form DDP's reducer gives it in ``backward()``."""
        if self.error is not None:
            raise self.error from None
        raise wrapped

    def submit(self, work):
        """Run ``work`` on the hook's thread (made at the first call)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ina-hook")
        return self._pool.submit(work)

    @property
    def _peers(self):
        if self.peers is None:
            self.peers = DistPeers(self.process_group)
        return self.peers

    def probe(self, ok=1, query=True):
        """Agree across ranks whether the switch answers (and, when ``query``, holds
        the job); warn and use Gloo if not, or raise when ``fallback_to_gloo`` is off."""
        why = f"no switch answered at {self.collective.switch[0]}:{self.collective.switch[1]}"
        error = SwitchUnavailable
        flag = self._peers.agree(ok)    # also: rank 0's CONTROL is done on every rank
        if flag and query:
            # rank 0 asks, once for all: a switch in hardware answers one STATUS_REQ at
            # a time (the board's control plane drops the others as drop_control_busy)
            ok = 2
            if self._peers.rank == 0:
                try:
                    ok = 2 if self.job_installed() else 1
                except OSError:
                    ok = 0
            flag = self._peers.agree(ok)
            if flag == 1:
                flag, why, error = 0, self.not_installed_reason(), JobNotInstalled
        if not flag:
            self._fall_back(why, error)
        return bool(flag)

    def job_installed(self) -> bool:
        """Whether the switch's job table holds this job (OSError: no answer)."""
        from ina_fabric.protocol.control_client import query_status
        jobs = query_status(self.collective.switch,
                            timeout=self.status_timeout).get("jobs", {})
        return str(self.collective.job) in {str(j) for j in jobs}

    def not_installed_reason(self) -> str:
        sw = self.collective.switch
        return (f"job {self.collective.job} is not installed on switch {sw[0]}:{sw[1]} "
                f"(rank 0 installs it unless the job is static; a static job must be in "
                f"the switch's table, e.g. `ina hw-config` or `ina switch --local-workers`)")

    def diagnose(self, error: SwitchUnavailable) -> SwitchUnavailable:
        """A call got no answer: say whether the switch is down or lacks the job."""
        try:
            installed = self.job_installed()
        except OSError:
            return error
        return error if installed else JobNotInstalled(self.not_installed_reason())

    def _fall_back(self, why, error=SwitchUnavailable):
        if self.use_switch and self.fallback_to_gloo:
            warnings.warn(f"INA: {why}; falling back to Gloo allreduce", RuntimeWarning,
                          stacklevel=3)
        elif not self.fallback_to_gloo:
            raise error(f"INA: {why}; not falling back to Gloo (INA_FALLBACK=gloo "
                        f"allows it)")
        self.use_switch = False

    def close(self, remove: bool = True):
        """End this rank's use of the job. The rank that installed it removes it from
        the switch (with its session: another run's install is never touched), so the
        job id is free at once for the next run instead of after the switch's idle
        reclaim; call it when every rank is done (``ina train`` closes after its final
        barrier), or pass ``remove=False``."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if remove and self.installed and self.use_switch:
            self.installed = False
            from ..switch.model import IDLE_RECLAIM_S
            from ina_fabric.protocol.control_client import remove_job
            c = self.collective
            try:
                remove_job(c.switch, c.job, c.session, timeout=1.0)
            except Exception as e:  # noqa: BLE001 (a switch gone or a key missing)
                warnings.warn(f"INA: could not remove job {c.job} from switch "
                              f"{c.switch[0]}:{c.switch[1]} ({e}); it is freed after "
                              f"{IDLE_RECLAIM_S:g} s idle", RuntimeWarning, stacklevel=2)
        close = getattr(self.collective, "close", None)
        if close:
            close()

    # -- the derived slot deadline (bounded mode; the rule is host.deadline's) ---------
    def agree_rto(self):
        """Every rank's RTT-based timeout and its count of re-fetched RESULTs since the
        last exchange, exchanged (one small allreduce, at the same call on every rank).
        The largest timeout is the job's: the rank behind the most congested link is
        the one whose lost RESULTs the deadline must cover. The counts' sum decides
        ``clean_intervals`` (the loss-aware rule)."""
        from ..transport.window import WindowConfig
        c = self.collective
        mine = c._rtt.base_rto(WindowConfig.of(c)) if c._rtt.srtt else 0.0
        refetched = self.stats.refetched - self._refetched_at_exchange
        self._refetched_at_exchange = self.stats.refetched
        if not self.exchange_rto:
            rto, lost = mine, refetched
        else:
            world = self._peers.world
            v = torch.zeros(2 * world, dtype=torch.float64)
            v[self._peers.rank] = mine
            v[world + self._peers.rank] = refetched
            self._peers.allreduce(v)
            rto, lost = float(v[:world].max()), int(v[world:].sum())
        self.tuner.agreed(rto, lost)
        self.extra_stats["agreed_rto_ms"] = (self.tuner.agreed_rto or 0.0) * 1e3
        self.extra_stats["refetched_results"] = \
            self.extra_stats.get("refetched_results", 0) + lost

    def tune_deadline(self, size: int):
        """Before a call: the tuner's deadline for this call's window; rank 0 moves the
        switch's deadline live (only the deadline changes; slots and data in flight
        stay) when the tuner says it is worth it, before its own first packet."""
        from ina_fabric.protocol.fields import HEADER_BYTES
        c = self.collective
        w = c.call_window(-(-size // c.elements)) if size else 1
        d = self.tuner.deadline(w, HEADER_BYTES + 4 * c.elements)
        if self.job_config is None or not self.installed:
            c.deadline = d        # the client's giveup follows the switch's deadline
            return
        if not self.tuner.should_move(self.job_config.deadline, d):
            return
        import dataclasses
        from ina_fabric.protocol.control_client import send_job
        new = dataclasses.replace(self.job_config, deadline=d)
        try:
            send_job(c.switch, new, timeout=1.0, update=True)
        except Exception as e:  # noqa: BLE001 (refused or no answer: keep the old one)
            warnings.warn(f"INA: could not move job {c.job}'s slot deadline to "
                          f"{d * 1e3:.1f} ms ({e})", RuntimeWarning, stacklevel=2)
            return
        self.job_config = new
        c.deadline = d
        self.tuner.moved(d)
        self.extra_stats["switch_deadline_ms"] = d * 1e3

    def reduce_array(self, arr: np.ndarray, in_place: bool = False,
                     precision=None) -> np.ndarray:
        """One allreduce of a float32 array through the collective, counted in the
        statistics; the sum (a new array, or ``arr`` itself when ``in_place``: a
        ``SwitchClient`` only). ``precision``: the call's (a ``SwitchClient`` only; None:
        ``precision_for()``). SwitchUnavailable when no answer came."""
        import time
        if self.tuner is not None:
            self.tune_deadline(arr.size)
        kw = {}
        if isinstance(self.collective, SwitchClient):
            kw["precision"] = precision = precision or self.precision_for()
        t = time.perf_counter()
        out, st = self.collective.allreduce(arr, out=arr, **kw) if in_place else \
            self.collective.allreduce(arr, **kw)
        dt = time.perf_counter() - t
        if self.tuner is not None and self.tuner.call_done():
            self.agree_rto()
        self.comm_seconds += dt
        self.call_seconds.append(dt)
        if isinstance(st, AllreduceStats):
            self.stats.add(st)
            rt = getattr(self.collective, "_rtt", None)
            if rt is not None:      # congestion control: where the window stands
                self.extra_stats["cwnd"] = rt.cwnd
                self.extra_stats["cwnd_cuts"] = rt.cuts
        elif isinstance(st, dict):  # other collectives: sum what is numeric
            for k, v in st.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    self.extra_stats[k] = self.extra_stats.get(k, 0) + v
        sent = st.get("bytes") if isinstance(st, dict) else None
        bits = precision.bits if precision is not None else 32
        nbytes = int(sent) if sent is not None else arr.size * bits // 8
        self.bytes_sent += nbytes
        self.bytes_by_width[bits] = self.bytes_by_width.get(bits, 0) + nbytes
        return out

    # the work of one bucket, on the hook thread
    def reduce(self, tensor: torch.Tensor, precision=None) -> torch.Tensor:
        world = self._peers.world
        if self.use_switch and self.behind:
            return tensor         # behind: this step's update is replaced by a replica
        if self.use_switch:
            arr = tensor.detach().numpy()
            if arr.size:
                self.max_abs_local = max(self.max_abs_local,
                                         float(arr.max()), -float(arr.min()))
            in_place = isinstance(self.collective, SwitchClient)
            try:
                # a SwitchClient sums the bucket in place (no output array per bucket)
                out = self.reduce_array(arr, in_place, precision)
            except AllreduceTooLate:
                if not self.rejoin:
                    raise
                self.behind = True   # rejoin (host.ddp.rejoin) instead of ending the job
                return tensor
            except SwitchUnavailable as e:
                # Not a fallback: the ranks decide that together, at setup (``probe``).
                # A switch lost mid-run may have answered some ranks' last call and not
                # others': a rank alone on Gloo would pair its calls with nobody's (the
                # hang of issue 43), so every rank ends with the reason instead.
                self.fallbacks += 1
                raise self.diagnose(e) from None
            else:
                result = tensor if in_place else torch.from_numpy(out)
                if self.average:
                    result.div_(world)
                return result
        self._peers.allreduce(tensor)
        if self.average:
            tensor.div_(world)
        return tensor


def ina_hook(state: InaHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: allreduce ``bucket.buffer()`` through the switch (or Gloo)."""
    tensor = bucket.buffer()
    fut = torch.futures.Future()
    # the bucket's precision (set_precision: a controller's per-bucket choice), decided
    # on the training thread, in bucket order
    precision = state.precision_for(bucket) if state.use_switch else None

    def work():
        try:
            fut.set_result(state.reduce(tensor, precision))
        except Exception as e:  # surfaces in backward() on the training thread (DDP's
            state.error = e     # reducer shows it as "Unable to cast ... to Tensor":
            fut.set_exception(e)    # raise_error() gives the error itself)

    state.submit(work)
    return fut


# -- setup: environment, socket, addresses, job, probe ---------------------------------
def setup_hook_state(process_group=None, switch=None, job=None, mode=None, window=None,
                     elements=None, deadline=None, configure=True, impairment=None,
                     connect_timeout=2.0, bind_port=None, peers=None, job_offset=0,
                     session=None, carry=False, deadline_rule=None, precision=None,
                     **fields) -> InaHookState:
    """Build the hook's state for this rank of a torchrun job.

    1. :func:`hook_settings`: the environment over the arguments, over the defaults of
       the link towards the switch (loopback or Ethernet);
    2. :func:`bind_client`: this rank's UDP socket, on the interface facing the switch;
    3. :func:`exchange_addresses`: the ranks' addresses, rank 0's session id and (a
       static job) where a new run resumes, over ``peers`` (default
       ``DistPeers(process_group)``);
    4. :func:`install_job`: rank 0 installs the job with a CONTROL datagram
       (``configure=False`` when the switch's job table is loaded another way, as on the
       FPGA, which takes its jobs from ``ina hw-config``: then rank r binds
       ``INA_PORT + r`` (or ``bind_port + r``) so the addresses match that table, the
       job's session is INA_SESSION (or ``session``), and no STATUS probe is sent; a dead
       switch shows at the first bucket instead);
    5. ``InaHookState.probe``: every rank agrees whether the switch answers and holds
       the job (warn and use Gloo, or raise, if not).

    ``job_offset`` is added to the job id (a subgroup's job); ``precision``: the calls'
    (INA_PRECISION overrides it; per bucket: ``InaHookState.set_precision``); ``fields``: ``average``,
    ``fallback_to_gloo`` (INA_FALLBACK=gloo|raise overrides it)."""
    peers = peers if peers is not None else DistPeers(process_group)
    s = hook_settings(None, switch, job, mode, window, elements, deadline, bind_port,
                      job_offset, session, carry, deadline_rule, precision)
    if not configure and s.session is None:
        raise ValueError("a job the switch already holds (no CONTROL): give its session "
                         "id in INA_SESSION (the `session` of its [[job]] table)")
    if s.fallback is not None:
        fields["fallback_to_gloo"] = s.fallback
    client = bind_client(s, peers.rank, peers.world, configure, impairment, connect_timeout)
    try:
        members, refused = exchange_addresses(
            peers, client, s.session if not configure else None, connect_timeout,
            fresh=session if configure else None)
        state = InaHookState(client, process_group, peers=peers, **fields)
        ok = 1
        if configure and peers.rank == 0:
            state.job_config, ok = install_job(s, client, members, connect_timeout)
            state.installed = bool(ok)
        if s.auto and configure:
            from ..deadline import SlotDeadlineTuner
            state.tuner = SlotDeadlineTuner(s.rule, s.link_rate)
            state.tuner.moved(s.deadline)
        if refused:       # every rank alike: rank 0's reason, raised or warned
            from ina_fabric.protocol.fields import Refusal
            from ..transport.switch_client import SwitchRefused
            state._fall_back(refused[1], JobNotInstalled
                             if refused[0] == Refusal.UNKNOWN_JOB else SwitchRefused)
        else:
            state.probe(ok, query=configure)
    except BaseException:
        client.close()
        raise
    return state


def bind_client(s: HookSettings, rank: int, world: int, configure: bool = True,
                impairment=None, connect_timeout: float = 2.0) -> SwitchClient:
    """This rank's ``SwitchClient``, bound on the interface facing the switch (port
    ``INA_PORT + rank`` when a base is given, else any). With ``configure`` and the switch
    on this host, its RESULTs may come to a multicast group, one copy for all ranks."""
    from ina_fabric.protocol.jobtable import loopback_group
    group = loopback_group(s.switch, s.job) if configure else None
    # a tree of switches (docs/fabric.md): the worker's id is its index at its own
    # switch (INA_WORKER), the job's workers the whole tree's
    worker = rank if s.worker is None else s.worker
    return SwitchClient(s.switch, s.job, worker, world, s.window, s.elements, s.mode,
                        bind=(local_address_towards(s.switch),
                              s.bind_base + rank if s.bind_base else 0),
                        deadline=s.deadline, group=group,
                        connect_timeout=connect_timeout, impairment=impairment,
                        pace_rate=s.pace_rate, congestion=s.congestion, carry=s.carry,
                        precision=s.precision, engine=s.engine,
                        local_queue=s.local_queue, gso=s.gso)


def exchange_addresses(peers, client: SwitchClient, session=None,
                       connect_timeout: float = 2.0, fresh=None):
    """Every rank's (address, multicast group or None), gathered over ``peers``, and
    rank 0's refusal (``[fields.Refusal, message]``, or None). Every rank's client starts with rank 0's session
    id (a fresh one, or ``session``: a static job's) and, for a static job, at the
    position rank 0 read from the switch (where a new run resumes; STATUS). ``fresh``:
    the new session to install under, when the caller draws it (the ``ina`` backend's
    ``run_session``)."""
    import json
    from ina_fabric.protocol.jobtable import new_session
    mine = session if session is not None else fresh or new_session()
    position = 0      # a static job: rank 0 asks where a new run resumes
    if session is not None and peers.rank == 0:
        from ..transport.switch_client import static_position
        try:
            position = static_position(client.switch, client.job, mine,
                                       timeout=connect_timeout, workers=peers.world)
        except OSError as e:      # SwitchRefused: no such job, another session, ...
            position = [int(getattr(e, "reason", 0) or 0), str(e)]
    mac = local_mac(client.address[0])     # (a board sends RESULT frames to it)
    gathered = [json.loads(t) for t in peers.gather(json.dumps(
        [f"{client.address[0]}:{client.address[1]}" + (f"@{mac}" if mac else ""),
         client.group, str(mine), position]))]
    members = [(m, tuple(g) if g else None) for m, g, _, _ in gathered]
    refused = gathered[0][3] if isinstance(gathered[0][3], list) else None
    if session is not None and gathered[0][3] is None:
        sw = client.switch
        warnings.warn(f"INA: switch {sw[0]}:{sw[1]} did not answer STATUS (no "
                      f"control key here?): static job {client.job} starts at seq 0; a run "
                      f"after an earlier one may then be refused (STALE) or, after "
                      f"a run shorter than two windows, take its stored results",
                      RuntimeWarning, stacklevel=2)
    client.start(int(gathered[0][2]), 0 if refused else gathered[0][3] or 0)
    return members, refused


def install_job(s: HookSettings, client: SwitchClient, members: list,
                connect_timeout: float = 2.0):
    """Rank 0: install the job on the switch (CONTROL). Returns (JobConfig, 1), or
    (JobConfig, 0) when no switch answered (the probe then decides for every rank);
    ``JobRefused`` with the switch's reason."""
    from ina_fabric.protocol.jobtable import JobConfig
    from ina_fabric.protocol.control_client import send_job
    group = client.group
    mcast = group if all(g == group for _, g in members) else None
    cfg = JobConfig(s.job, tuple(m for m, _ in members), s.window, s.elements, s.deadline,
                    s.mode, mcast, client.session)
    try:
        send_job(s.switch, cfg, timeout=connect_timeout)
    except OSError:
        return cfg, 0
    return cfg, 1

