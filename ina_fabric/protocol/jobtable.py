"""Job-table entries: the configuration one job needs in a switch (software or FPGA).

The binary form (``JobConfig.to_bytes``) is the payload of a CONTROL datagram, the bytes
``ina hw-config`` writes for the FPGA, and what the software switch loads. It is defined
once, here, by two numpy dtypes.
"""

from dataclasses import dataclass, field
import ipaddress
import secrets
import tomllib

import numpy as np

from .fields import MAX_WORKERS, MAX_JOB_WORKERS, HEADER_BYTES

__all__ = ["JobConfig", "JobSettings", "LINK_DEFAULTS", "job_defaults", "loopback_group",
           "MAX_ELEMENTS", "Member",
           "ConfigError", "ENTRY_DTYPE", "MEMBER_DTYPE", "load_jobs_toml", "MODES",
           "GATEWARE_MODES",
           "ENTRY_UPDATE", "ENTRY_TREE", "TREE_DTYPE", "parse_control", "IDLE_RECLAIM_S", "new_session", "parse_session",
           "removal_entry"]

#: "bounded-skip": bounded, and a worker that a slot closed without at its deadline is
#: skipped by the job's later slots until its next DATA (host/switch/model.py); the
#: software switches only: the gateware refuses mode 2 (hw/ina/control.py)
MODES = ("reliable", "bounded", "bounded-skip")
#: the modes the gateware runs (hw/ina/control.py drops an entry with any other)
GATEWARE_MODES = MODES[:2]
#: a job id is held by its session: an install under another session is refused while
#: the job has had DATA (or its install) within this many seconds; an idle one (a run
#: that crashed without removing its job) may be taken over (every switch: the model,
#: the compiled engine through it, the gateware's control plane)
IDLE_RECLAIM_S = 60.0
MAX_ELEMENTS = (65507 - HEADER_BYTES) // 4   # largest UDP payload, less the INA header

ENTRY_DTYPE = np.dtype([
    ("job", ">u2"), ("nworkers", "u1"), ("mode", "u1"), ("window", ">u2"),
    ("elements", ">u2"), ("deadline_us", ">u4"), ("mcast_ip", ">u4"),
    ("mcast_port", ">u2"), ("flags", ">u2"), ("session", ">u8"),
])
#: entry flag: a live update of an installed job. Only the deadline may differ from the
#: installed entry, and the slots are kept; without it, an entry is an install, which
#: always starts the job's slots afresh (a second run never sees the first one's state).
ENTRY_UPDATE = 0x0001
#: entry flag: the job is part of a tree of switches (docs/fabric.md); a TREE_DTYPE
#: record follows the members. ``parent_ip`` 0: this switch is the root. ``children`` 1:
#: the members are child switches, each DATA's ``count`` says how many workers its partial
#: sum covers; 0: the members are workers (each DATA covers one). ``workers``: the workers
#: below this switch when every one of them contributes (a leaf: its members; the root:
#: the job's). A switch without the flag is a one-switch job, as before.
ENTRY_TREE = 0x0002
MEMBER_DTYPE = np.dtype([("ip", ">u4"), ("port", ">u2"), ("mac", "u1", (6,))])
TREE_DTYPE = np.dtype([("parent_ip", ">u4"), ("parent_port", ">u2"), ("index", "u1"),
                       ("children", "u1"), ("workers", ">u2"), ("reserved", ">u2")])


def new_session() -> int:
    """A fresh session id: 64 random bits (never 0, which no job holds)."""
    return secrets.randbits(64) or 1


class ConfigError(ValueError):
    """A job configuration that cannot work; the message says which field and why."""


@dataclass(frozen=True)
class JobSettings:
    """What a job needs besides its id and its members: the one place its defaults live.

    ``deadline`` is in seconds here (the wire carries microseconds); every flag, TOML key
    and environment variable gives it in milliseconds (``--deadline-ms``,
    ``deadline_ms``)."""
    window: int = 64                 # slots in flight per job (a power of two for the FPGA)
    elements: int = 256              # int32 elements per packet
    deadline: float = 0.005          # seconds after a slot opens (bounded mode)
    mode: str = "reliable"           # or "bounded", "bounded-skip" (MODES)

    @property
    def deadline_ms(self) -> float:
        return self.deadline * 1e3


#: Defaults per link kind, chosen by the datagram each link carries best:
#:
#: - ``ethernet``: 256 elements, 1,052-byte datagrams: they fit a 1500-byte MTU and the
#:   FPGA's element memory;
#: - ``jumbo``: 2,048 elements, 8,220-byte datagrams, for links with a 9000-byte MTU;
#: - ``loopback``: 16,368 elements, 65,500-byte datagrams, just under the largest UDP
#:   payload (65,507): on one host the per-datagram cost dominates, not the MTU, so the
#:   fewer datagrams the better (16,368 = the largest multiple of 16 that fits).
LINK_DEFAULTS = {
    "ethernet": JobSettings(),
    "jumbo": JobSettings(elements=2048),
    "loopback": JobSettings(elements=16368),
}


def job_defaults(link: str = "ethernet", **changes) -> JobSettings:
    """The defaults for ``link`` ("ethernet", "jumbo" or "loopback"), with ``changes`` applied
    (a None value keeps the default)."""
    import dataclasses
    if link not in LINK_DEFAULTS:
        raise ConfigError(f"link {link!r}: expected one of {', '.join(LINK_DEFAULTS)}")
    return dataclasses.replace(LINK_DEFAULTS[link],
                               **{k: v for k, v in changes.items() if v is not None})


_D = LINK_DEFAULTS["ethernet"]


def loopback_group(switch, job: int):
    """The IP multicast group for the RESULTs of job ``job`` when its workers share a host
    with the switch at ``switch`` (ip, port), or None when the switch is not on loopback.

    One copy per RESULT instead of N: the group is ``239.P.P.J`` (organization-local scope;
    ``P.P`` the switch's port, ``J`` the job id's low byte) on the switch's own UDP port,
    so concurrent switches and jobs on one host do not share a group (two jobs of one
    switch whose ids differ only above the low byte do: each worker then drops the other
    job's RESULTs, which carry the other job id). The port is the switch's: nothing else
    on the host can hold it for any address the switch has bound."""
    ip, port = switch[0], int(switch[1])
    try:
        if not ipaddress.IPv4Address(ip).is_loopback:
            return None
    except ValueError:
        return None
    return f"239.{port >> 8}.{port & 0xFF}.{job & 0xFF}", port


@dataclass(frozen=True)
class Member:
    ip: str
    port: int
    mac: str = "00:00:00:00:00:00"

    @classmethod
    def parse(cls, text: str) -> "Member":
        """``ip:port`` or ``ip:port@mac``."""
        addr, _, mac = text.partition("@")
        ip, sep, port = addr.rpartition(":")
        if not sep:
            raise ConfigError(f"member {text!r}: expected ip:port")
        try:
            ipaddress.IPv4Address(ip)
            port_n = int(port)
        except ValueError as e:
            raise ConfigError(f"member {text!r}: {e}") from None
        if not 0 < port_n < 65536:
            raise ConfigError(f"member {text!r}: port out of range")
        return cls(ip, port_n, mac or "00:00:00:00:00:00")

    @property
    def addr(self) -> tuple[str, int]:
        return (self.ip, self.port)


@dataclass(frozen=True)
class JobConfig:
    """One aggregation job. Worker ``w`` is ``members[w]``."""
    job: int
    members: tuple[Member, ...]
    window: int = _D.window
    elements: int = _D.elements
    deadline: float = _D.deadline    # seconds; used in bounded mode
    mode: str = _D.mode
    mcast: tuple[str, int] | None = None   # IP multicast group instead of unicast copies
    #: the run's session id, carried by every DATA and RESULT of the job; a fresh one per
    #: JobConfig unless given (every rank of a run must use the installer's)
    session: int = field(default_factory=new_session)
    #: a tree of switches (docs/fabric.md): the parent switch's (ip, port), None at the
    #: root; this switch's member id in the parent's entry of the job
    parent: tuple[str, int] | None = None
    index: int = 0
    #: the members are child switches (their DATA carry the workers they cover in
    #: ``count``), not workers
    children: bool = False
    #: workers below this switch when all contribute (0: one per member; a switch with
    #: children needs it: the job's RESULT is PARTIAL when its count is lower)
    workers: int = 0

    def __post_init__(self):
        object.__setattr__(self, "members", tuple(
            m if isinstance(m, Member) else Member.parse(m) for m in self.members))
        n = len(self.members)
        if not 0 <= self.job < 65536:
            raise ConfigError(f"job {self.job}: id must be in 0..65535")
        if not 1 <= n <= MAX_WORKERS:
            raise ConfigError(f"job {self.job}: {n} members, need 1..{MAX_WORKERS}")
        if len({m.addr for m in self.members}) != n:
            raise ConfigError(f"job {self.job}: duplicate member address")
        if not 1 <= self.window <= 32768:
            raise ConfigError(f"job {self.job}: window {self.window} not in 1..32768")
        if self.window & (self.window - 1):
            raise ConfigError(f"job {self.job}: window {self.window} must be a power of two "
                              f"(slot indices stay consecutive across the 2^32 wrap of seq)")
        if not 1 <= self.elements <= MAX_ELEMENTS:
            raise ConfigError(f"job {self.job}: elements {self.elements} not in "
                              f"1..{MAX_ELEMENTS} (a UDP datagram holds at most 65507 bytes)")
        if not 0 < self.deadline < 4294:
            raise ConfigError(f"job {self.job}: deadline {self.deadline}s must be > 0")
        if self.mode not in MODES:
            raise ConfigError(f"job {self.job}: mode {self.mode!r} not in {MODES}")
        if not 0 < self.session < 1 << 64:
            raise ConfigError(f"job {self.job}: session {self.session} not in 1..2^64-1")
        if self.parent is not None:
            p = Member.parse(self.parent) if isinstance(self.parent, str) else \
                Member(str(self.parent[0]), int(self.parent[1]))
            Member.parse(f"{p.ip}:{p.port}")
            object.__setattr__(self, "parent", p.addr)
        if not 0 <= self.index < MAX_WORKERS or (self.index and self.parent is None):
            raise ConfigError(f"job {self.job}: index {self.index} must be in "
                              f"0..{MAX_WORKERS - 1} (the member id at the parent)")
        total = self.workers or n
        if total > MAX_JOB_WORKERS:
            raise ConfigError(f"job {self.job}: {total} workers; a job holds at most "
                              f"{MAX_JOB_WORKERS} ({MAX_WORKERS} switches of "
                              f"{MAX_WORKERS} workers)")
        if not self.children and total != n:
            raise ConfigError(f"job {self.job}: workers {self.workers} differs from its "
                              f"{n} members, whose DATA cover one worker each (children "
                              f"switches cover more)")
        if self.children and total < n:
            raise ConfigError(f"job {self.job}: {n} child switches cover at least {n} "
                              f"workers, not {total}")

    @property
    def n(self) -> int:
        return len(self.members)

    @property
    def total(self) -> int:
        """The workers whose DATA a complete RESULT of this switch sums."""
        return self.workers or self.n

    @property
    def tree(self) -> bool:
        """Part of a tree of switches (has a parent or child switches)."""
        return self.parent is not None or self.children

    @property
    def settings(self) -> JobSettings:
        return JobSettings(self.window, self.elements, self.deadline, self.mode)

    @classmethod
    def from_settings(cls, job: int, members, settings: JobSettings,
                      mcast=None, session=None) -> "JobConfig":
        return cls(job, tuple(members), settings.window, settings.elements,
                   settings.deadline, settings.mode, mcast, session or new_session())

    def to_bytes(self, update: bool = False) -> bytes:
        """The entry; ``update=True`` marks it a live update (ENTRY_UPDATE)."""
        e = np.zeros((), ENTRY_DTYPE)
        e["flags"] = (ENTRY_UPDATE if update else 0) | (ENTRY_TREE if self.tree else 0)
        e["job"], e["nworkers"], e["mode"] = self.job, self.n, MODES.index(self.mode)
        e["window"], e["elements"] = self.window, self.elements
        e["deadline_us"] = round(self.deadline * 1e6)
        e["session"] = self.session
        if self.mcast:
            e["mcast_ip"] = int(ipaddress.IPv4Address(self.mcast[0]))
            e["mcast_port"] = self.mcast[1]
        m = np.zeros(self.n, MEMBER_DTYPE)
        m["ip"] = [int(ipaddress.IPv4Address(x.ip)) for x in self.members]
        m["port"] = [x.port for x in self.members]
        m["mac"] = [list(bytes.fromhex(x.mac.replace(":", ""))) for x in self.members]
        tail = b""
        if self.tree:
            t = np.zeros((), TREE_DTYPE)
            if self.parent:
                t["parent_ip"] = int(ipaddress.IPv4Address(self.parent[0]))
                t["parent_port"] = self.parent[1]
            t["index"], t["children"], t["workers"] = self.index, self.children, self.total
            tail = t.tobytes()
        return e.tobytes() + m.tobytes() + tail

    @classmethod
    def from_bytes(cls, data: bytes) -> "JobConfig":
        if len(data) < ENTRY_DTYPE.itemsize:
            raise ConfigError("job entry truncated")
        e = np.frombuffer(data, ENTRY_DTYPE, count=1)[0]
        n = int(e["nworkers"])
        tree = bool(int(e["flags"]) & ENTRY_TREE)
        if len(data) != ENTRY_DTYPE.itemsize + n * MEMBER_DTYPE.itemsize + \
                tree * TREE_DTYPE.itemsize:
            raise ConfigError(f"job entry length {len(data)} does not match {n} members"
                              + (" and the tree record" if tree else ""))
        if e["mode"] >= len(MODES):
            raise ConfigError(f"job entry: unknown mode {int(e['mode'])}")
        m = np.frombuffer(data, MEMBER_DTYPE, count=n, offset=ENTRY_DTYPE.itemsize)
        members = tuple(Member(str(ipaddress.IPv4Address(int(x["ip"]))), int(x["port"]),
                               ":".join(f"{b:02x}" for b in x["mac"])) for x in m)
        mcast = None
        if e["mcast_ip"]:
            mcast = (str(ipaddress.IPv4Address(int(e["mcast_ip"]))), int(e["mcast_port"]))
        tree_kw = {}
        if tree:
            t = np.frombuffer(data, TREE_DTYPE, count=1,
                              offset=ENTRY_DTYPE.itemsize + n * MEMBER_DTYPE.itemsize)[0]
            if int(t["children"]) > 1 or int(t["reserved"]):
                raise ConfigError("job entry: malformed tree record")
            tree_kw = dict(index=int(t["index"]), children=bool(t["children"]),
                           workers=int(t["workers"]) if t["children"] else 0,
                           parent=(str(ipaddress.IPv4Address(int(t["parent_ip"]))),
                                   int(t["parent_port"])) if t["parent_ip"] else None)
            if not tree_kw["children"] and int(t["workers"]) != n:
                raise ConfigError(f"job entry: tree record covers {int(t['workers'])} "
                                  f"workers, but {n} worker members")
        return cls(int(e["job"]), members, int(e["window"]), int(e["elements"]),
                   int(e["deadline_us"]) / 1e6, MODES[int(e["mode"])], mcast,
                   int(e["session"]), **tree_kw)


def parse_control(payload: bytes):
    """A CONTROL payload as ``(op, value)``: ``("remove", (job_id, session))`` for an entry with
    zero workers (session 0: whatever session the job has), ``("update", JobConfig)`` for one flagged ENTRY_UPDATE, ``("install",
    JobConfig)`` otherwise. Raises ConfigError for anything malformed."""
    if len(payload) < ENTRY_DTYPE.itemsize:
        raise ConfigError("job entry truncated")
    e = np.frombuffer(payload, ENTRY_DTYPE, count=1)[0]
    if int(e["flags"]) & ~(ENTRY_UPDATE | ENTRY_TREE):
        raise ConfigError(f"job entry: unknown flags 0x{int(e['flags']):04x}")
    if e["nworkers"] == 0:
        if len(payload) != ENTRY_DTYPE.itemsize:
            raise ConfigError("job removal entry with members")
        return "remove", (int(e["job"]), int(e["session"]))
    cfg = JobConfig.from_bytes(payload)
    return ("update" if int(e["flags"]) & ENTRY_UPDATE else "install"), cfg


def parse_session(text) -> int:
    """A session id from an int or a string (decimal or 0x-hex); ConfigError if bad."""
    try:
        v = text if isinstance(text, int) and not isinstance(text, bool) else int(str(text), 0)
    except ValueError:
        v = -1
    if not 0 < v < 1 << 64:
        raise ConfigError(f"session {text!r}: expected a number in 1..2^64-1 (e.g. 0x1f2e...)")
    return v


def _session_of(t, path):
    if "session" not in t:
        return None
    try:
        return parse_session(t["session"])
    except ConfigError as e:
        raise ConfigError(f"{path}: job {t.get('id')!r}: {e}") from None


def removal_entry(job: int, session: int = 0) -> bytes:
    """The CONTROL payload that removes job ``job`` (only while it holds ``session``;
    0: whatever it holds)."""
    e = np.zeros((), ENTRY_DTYPE)
    e["job"], e["session"] = job, session
    return e.tobytes()


def load_jobs_toml(path) -> list[JobConfig]:
    """Jobs from a TOML file with one ``[[job]]`` table per job. See docs/design.md, "Software switch", for keys."""
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{path}: {e}") from None
    jobs = []
    known = {"id", "workers", "window", "elements", "deadline_ms", "mode", "multicast",
             "session", "parent", "index", "total_workers"}
    for t in doc.get("job", []):
        unknown = set(t) - known
        if unknown:
            raise ConfigError(f"{path}: unknown job keys {sorted(unknown)}")
        if "id" not in t or "workers" not in t:
            raise ConfigError(f"{path}: each [[job]] needs id and workers")
        mcast = None
        if "multicast" in t:
            mcast = Member.parse(t["multicast"]).addr

        def num(key, kind, default):
            v = t.get(key, default)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or \
                    (kind is int and v != int(v)):
                raise ConfigError(f"{path}: job {t.get('id')!r}: {key} = {v!r} is not "
                                  f"{'an integer' if kind is int else 'a number'}")
            return kind(v)
        if not isinstance(t["workers"], list):
            raise ConfigError(f"{path}: job {t['id']!r}: workers must be a list of "
                              f"\"ip:port\" strings")
        jobs.append(JobConfig(num("id", int, None), tuple(t["workers"]),
                              num("window", int, _D.window),
                              num("elements", int, _D.elements),
                              num("deadline_ms", float, _D.deadline_ms) / 1e3,
                              t.get("mode", _D.mode), mcast,
                              _session_of(t, path) or new_session(),
                              # a tree of switches (docs/fabric.md)
                              parent=Member.parse(t["parent"]).addr if "parent" in t
                              else None,
                              index=num("index", int, 0),
                              children="total_workers" in t,
                              workers=num("total_workers", int, 0)))
    if not jobs:
        raise ConfigError(f"{path}: no [[job]] tables")
    if len({j.job for j in jobs}) != len(jobs):
        raise ConfigError(f"{path}: duplicate job id")
    return jobs
