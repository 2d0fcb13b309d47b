"""A DDP communication hook that sends each gradient bucket through a switch.

In the shape of ``torch.distributed.algorithms.ddp_comm_hooks``::

    state = InaHookState.from_env(process_group)   # or InaHookState(collective, group)
    model.register_comm_hook(state, ina_hook)

Any bucket count and size works: each bucket is one ``allreduce`` call on the collective
(a ``SwitchClient`` or anything with ``allreduce(np.ndarray) -> (np.ndarray, stats)``),
run on one background thread per rank, in bucket order, so backward computation goes on
while a bucket is on the wire. If no switch answers, the hook warns once and falls back
to Gloo allreduce; every rank reaches the same decision (see ``InaHookState.probe``).
"""

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
import os
import socket
import threading
import warnings

import numpy as np
import torch
import torch.distributed as dist

from ina_fabric.protocol.jobtable import job_defaults

from ..transport.switch_client import SwitchClient, SwitchUnavailable, AllreduceStats

__all__ = ["InaHookState", "ina_hook", "switch_from_env", "local_address_towards",
           "DistPeers", "JobNotInstalled"]


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


def switch_from_env(default=None):
    """``INA_SWITCH=ip:port`` (or the default), parsed; ValueError with a clear message."""
    text = os.environ.get("INA_SWITCH", default)
    if not text:
        raise ValueError("no switch address: set INA_SWITCH=ip:port or pass switch=")
    host, sep, port = str(text).rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad switch address {text!r}: expected ip:port")
    return host, int(port)


@dataclass
class InaHookState:
    collective: object
    process_group: object = None
    average: bool = True
    fallback_to_gloo: bool = True
    use_switch: bool = True
    fallbacks: int = 0
    stats: AllreduceStats = field(default_factory=AllreduceStats)
    comm_seconds: float = 0.0
    bytes_sent: int = 0
    max_abs_local: float = 0.0   # largest |gradient| this rank contributed (error bounds)
    extra_stats: dict = field(default_factory=dict)   # summed numeric stats of other collectives
    call_seconds: list = field(default_factory=list)  # wall time of every allreduce call
    peers: object = None        # DistPeers(process_group) unless given
    #: this rank installed the job (rank 0, ``configure``): ``close()`` removes it
    installed: bool = False
    #: bounded mode with a derived slot deadline (``host.transport.slot_deadline``):
    #: the link rate (bit/s, None: unknown), the job as installed (rank 0 moves its
    #: deadline live), the ranks' agreed timeout, and (call, deadline) at every move
    auto_deadline: bool = False
    link_rate: float | None = None
    job_config: object = None
    agreed_rto: float | None = None
    deadline_history: list = field(default_factory=list)
    #: exchange the ranks' timeouts over ``peers`` (the ``ina`` backend turns it off:
    #: its wire thread may not use the caller's Gloo group; rank 0's own is used)
    exchange_rto: bool = True
    #: ``slot_deadline.RULES``: ``derived`` or ``loss-aware`` (the short deadline while
    #: no rank re-fetched a RESULT); ``clean_intervals``: exchanges in a row without one
    deadline_rule: str = "loss-aware"
    #: seconds a STATUS request (the start-up probe) waits for its answer (a simulated
    #: board answers in simulated time: ``ina train --engine board`` gives it longer)
    status_timeout: float = 1.0
    clean_intervals: int = 0
    _refetched_at_exchange: int = 0
    _tune_calls: int = 0
    _tune_window: int = 0
    error: BaseException | None = None   # the last bucket's error, if one failed

    def raise_error(self, wrapped: BaseException):
        """Re-raise the error of a failed bucket (set by ``ina_hook``) in place of
        ``wrapped``, the form DDP's reducer gives it in ``backward()``."""
        if self.error is not None:
            raise self.error from None
        raise wrapped

    def __post_init__(self):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ina-hook")
        self._lock = threading.Lock()

    @property
    def _peers(self):
        if self.peers is None:
            self.peers = DistPeers(self.process_group)
        return self.peers

    @classmethod
    def from_env(cls, process_group=None, switch=None, job=None, mode=None, window=None,
                 elements=None, deadline=None, configure=True, impairment=None,
                 connect_timeout=2.0, bind_port=None, peers=None, job_offset=0,
                 session=None, carry=False, deadline_rule=None, **fields):
        """Build the state for this rank of a torchrun job.

        Environment (each overrides the argument; unset, the Ethernet defaults of
        ``ina_fabric.protocol.jobtable.LINK_DEFAULTS``): INA_SWITCH (ip:port), INA_JOB
        (default 1), INA_MODE (reliable|bounded|bounded-skip), INA_CARRY (1: a bounded
        worker's left-out contribution goes with its next call, ``SwitchClient.carry``),
        INA_ELEMENTS (per packet), INA_WINDOW,
        INA_DEADLINE_MS (milliseconds, as every flag and TOML key; ``auto``, or
        ``deadline="auto"``: bounded mode's slot deadline derived from the link and the
        ranks' timeouts, ``host.transport.slot_deadline``), INA_DEADLINE_RULE (or
        ``deadline_rule``: that derivation's rule, ``loss-aware`` (the default) or
        ``derived``), INA_LINK_RATE (bit/s of the
        workers' links: the derived deadline's, and the client's pacing rate),
        INA_PACE_RATE (bit/s, overrides the pacing rate; 0: none); RANK/WORLD_SIZE from
        torchrun. Every rank binds a UDP port
        on the interface facing the switch; the ranks exchange addresses over the
        process group and rank 0 installs the job on the switch with a CONTROL datagram
        (``configure=False`` if the switch's job table is loaded another way, as on the
        FPGA, which takes its jobs from ``ina hw-config``: then each rank binds
        ``INA_PORT + rank`` (or ``bind_port + rank``) so the addresses match that table,
        and no STATUS probe is sent; a dead switch shows at the first bucket instead).

        ``session`` (or INA_SESSION): with ``configure=False``, the session id of the job
        the switch holds (with ``configure``, rank 0 draws a fresh one and every rank
        takes it). ``peers``: how the ranks talk before the switch is in use (default
        ``DistPeers(process_group)``); ``job_offset`` is added to the job id (a
        subgroup's job); ``fields``: other fields of the state (``average``,
        ``fallback_to_gloo``; INA_FALLBACK=gloo|raise overrides the latter)."""
        peers = peers if peers is not None else DistPeers(process_group)
        rank, world = peers.rank, peers.world
        addr = switch_from_env(switch and f"{switch[0]}:{switch[1]}")
        try:
            addr = (socket.gethostbyname(addr[0]), addr[1])
        except OSError as e:
            raise ValueError(f"bad switch address {addr[0]}:{addr[1]}: {e}") from None
        job = int(os.environ.get("INA_JOB", job or 1)) + job_offset
        env = os.environ
        if env.get("INA_FALLBACK") in ("gloo", "raise"):
            fields["fallback_to_gloo"] = env["INA_FALLBACK"] == "gloo"
        # the slot deadline: INA_DEADLINE_MS (a number, or "auto"), else ``deadline``
        # (seconds, or "auto"); "auto" in bounded mode derives it from the link and the
        # ranks' timeouts (host.transport.slot_deadline): installed for the job's
        # window, moved live from the first call on (InaHookState.tune_deadline)
        text = env.get("INA_DEADLINE_MS", "").strip().lower()
        auto = text == "auto" or (not text and deadline == "auto")
        fixed = float(text) / 1e3 if text and not auto else \
            (None if auto or deadline == "auto" else deadline)
        s = job_defaults(
            "ethernet",
            elements=int(env["INA_ELEMENTS"]) if "INA_ELEMENTS" in env else elements,
            window=int(env["INA_WINDOW"]) if "INA_WINDOW" in env else window,
            mode=env.get("INA_MODE", mode), deadline=fixed)
        window, elements, mode, deadline = s.window, s.elements, s.mode, s.deadline
        auto = auto and mode in ("bounded", "bounded-skip")
        link_rate = float(env["INA_LINK_RATE"]) if env.get("INA_LINK_RATE") else None
        if auto:
            from ..transport.slot_deadline import slot_deadline
            from ina_fabric.protocol.fields import HEADER_BYTES
            deadline = slot_deadline(window, HEADER_BYTES + 4 * elements, link_rate)
        base = int(os.environ.get("INA_PORT", bind_port or 0))
        from ina_fabric.protocol.jobtable import loopback_group
        # switch on this host and the job installed here: its RESULTs go to a multicast
        # group, one copy for all ranks, if every rank joins it (else unicast)
        group = loopback_group(addr, job) if configure else None
        # pacing at the link rate (INA_PACE_RATE bit/s overrides INA_LINK_RATE; 0: none)
        pace = env.get("INA_PACE_RATE", env.get("INA_LINK_RATE", "")).strip()
        client = SwitchClient(addr, job, rank, world, window, elements, mode,
                              bind=(local_address_towards(addr), base + rank if base else 0),
                              deadline=deadline, group=group,
                              connect_timeout=connect_timeout, impairment=impairment,
                              pace_rate=float(pace) if pace else 0.0,
                              carry=env.get("INA_CARRY", "1" if carry else "0") == "1")
        import json    # a text per rank: its address, the group it joined (or null) and a
        # session id; rank 0's is the run's (a fresh one; a static job's is INA_SESSION)
        from ina_fabric.protocol.jobtable import new_session, parse_session
        if configure:
            session = new_session()
        elif "INA_SESSION" in env or session:
            session = parse_session(env.get("INA_SESSION", session))
        else:
            client.close()
            raise ValueError("a job the switch already holds (no CONTROL): give its session "
                             "id in INA_SESSION (the `session` of its [[job]] table)")
        mac = local_mac(client.address[0])     # (a board sends RESULT frames to it)
        gathered = [json.loads(t) for t in peers.gather(json.dumps(
            [f"{client.address[0]}:{client.address[1]}" + (f"@{mac}" if mac else ""),
             client.group, str(session)]))]
        members = [(m, tuple(g) if g else None) for m, g, _ in gathered]
        client.session = int(gathered[0][2])
        ok = 1
        if configure and rank == 0:
            from ina_fabric.protocol.jobtable import JobConfig
            from ..switch import send_job
            mcast = group if all(g == group for _, g in members) else None
            cfg = JobConfig(job, tuple(m for m, _ in members), window, elements, deadline,
                            mode, mcast, client.session)
            try:
                send_job(addr, cfg, timeout=connect_timeout)
            except OSError:
                ok = 0
        state = cls(client, process_group, peers=peers, **fields)
        state.installed = bool(configure and rank == 0 and ok)
        state.auto_deadline, state.link_rate = auto and configure, link_rate
        if configure and rank == 0:
            state.job_config = cfg
        if state.auto_deadline:
            from ..transport.slot_deadline import RULES
            rule = env.get("INA_DEADLINE_RULE", "").strip() or deadline_rule or "loss-aware"
            if rule not in RULES:
                client.close()
                raise ValueError(f"INA_DEADLINE_RULE={rule!r}: have {', '.join(RULES)}")
            state.deadline_rule = rule
            state.deadline_history.append((0, deadline))
        try:
            state.probe(ok, query=configure)
        except BaseException:
            client.close()
            raise
        return state

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
        from ..switch import query_status
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
        self._pool.shutdown(wait=True)
        if remove and self.installed and self.use_switch:
            self.installed = False
            from ..switch.model import IDLE_RECLAIM_S
            from ..switch.server import remove_job
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

    # -- the derived slot deadline (bounded mode, host.transport.slot_deadline) --------
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
            self.agreed_rto = mine or None
            lost = refetched
        else:
            world = self._peers.world
            v = torch.zeros(2 * world, dtype=torch.float64)
            v[self._peers.rank] = mine
            v[world + self._peers.rank] = refetched
            self._peers.allreduce(v)
            self.agreed_rto = float(v[:world].max()) or None
            lost = int(v[world:].sum())
        self.clean_intervals = 0 if lost else self.clean_intervals + 1
        self.extra_stats["agreed_rto_ms"] = (self.agreed_rto or 0.0) * 1e3
        self.extra_stats["refetched_results"] = \
            self.extra_stats.get("refetched_results", 0) + lost

    def tune_deadline(self, size: int):
        """Before a call: the rule's deadline for this call's window, the link rate and
        the agreed timeout; rank 0 moves the switch's deadline live (only the deadline
        changes; slots and data in flight stay) when it moved by more than
        ``RETUNE_CHANGE``. Rank 0 does it before its own first packet of the call."""
        from ..transport.slot_deadline import choose_deadline, RETUNE_CHANGE
        from ina_fabric.protocol.fields import HEADER_BYTES
        c = self.collective
        w = c.call_window(-(-size // c.elements)) if size else 1
        d = choose_deadline(self.deadline_rule, w, HEADER_BYTES + 4 * c.elements,
                            self.link_rate, self.agreed_rto, self.clean_intervals)
        self._tune_window = w
        if self.job_config is None or not self.installed:
            c.deadline = d        # the client's giveup follows the switch's deadline
            return
        cur = self.job_config.deadline
        if abs(d - cur) <= RETUNE_CHANGE * cur:
            return
        import dataclasses
        from ..switch import send_job
        new = dataclasses.replace(self.job_config, deadline=d)
        try:
            send_job(c.switch, new, timeout=1.0, update=True)
        except Exception as e:  # noqa: BLE001 (refused or no answer: keep the old one)
            warnings.warn(f"INA: could not move job {c.job}'s slot deadline to "
                          f"{d * 1e3:.1f} ms ({e})", RuntimeWarning, stacklevel=2)
            return
        self.job_config = new
        c.deadline = d
        self.deadline_history.append((self._tune_calls, d))
        self.extra_stats["switch_deadline_ms"] = d * 1e3

    def reduce_array(self, arr: np.ndarray, in_place: bool = False) -> np.ndarray:
        """One allreduce of a float32 array through the collective, counted in the
        statistics; the sum (a new array, or ``arr`` itself when ``in_place``: a
        ``SwitchClient`` only). SwitchUnavailable when no answer came."""
        import time
        if self.auto_deadline:
            self.tune_deadline(arr.size)
        t = time.perf_counter()
        out, st = self.collective.allreduce(arr, out=arr) if in_place else \
            self.collective.allreduce(arr)
        dt = time.perf_counter() - t
        if self.auto_deadline:
            self._tune_calls += 1
            from ..transport.slot_deadline import RETUNE_CALLS, EARLY_EXCHANGES
            if self._tune_calls % RETUNE_CALLS == 0 or self._tune_calls in EARLY_EXCHANGES:
                self.agree_rto()
        self.comm_seconds += dt
        self.call_seconds.append(dt)
        if isinstance(st, AllreduceStats):
            self.stats.add(st)
        elif isinstance(st, dict):  # other collectives: sum what is numeric
            for k, v in st.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    self.extra_stats[k] = self.extra_stats.get(k, 0) + v
        sent = st.get("bytes") if isinstance(st, dict) else None
        self.bytes_sent += int(sent) if sent is not None else arr.size * 4
        return out

    # the work of one bucket, on the hook thread
    def reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        world = self._peers.world
        if self.use_switch:
            arr = tensor.detach().numpy()
            if arr.size:
                self.max_abs_local = max(self.max_abs_local,
                                         float(arr.max()), -float(arr.min()))
            in_place = isinstance(self.collective, SwitchClient)
            try:
                # a SwitchClient sums the bucket in place (no output array per bucket);
                # SwitchUnavailable means no RESULT ever came, so nothing was written yet
                out = self.reduce_array(arr, in_place)
            except SwitchUnavailable as e:
                self.fallbacks += 1
                self._fall_back(str(e))
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

    def work():
        try:
            fut.set_result(state.reduce(tensor))
        except Exception as e:  # surfaces in backward() on the training thread (DDP's
            state.error = e     # reducer shows it as "Unable to cast ... to Tensor":
            fut.set_exception(e)    # raise_error() gives the error itself)

    state._pool.submit(work)
    return fut
