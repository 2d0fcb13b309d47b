"""The core's configuration and status registers, declared as data (shared by ``hw`` and
``host``; imports neither).

The register map is a table (:data:`GLOBAL_REGS`, :data:`JOB_REGS`, :data:`MEMBER_REGS`,
counters in :data:`COUNTER_NAMES`): the gateware decoder (``ina_fabric.hw.ina.regs``), the
host-side :func:`config_writes` and the documentation are all generated from it, in the
spirit of amaranth-soc's declarative registers (amaranth-soc is not on PyPI).

The bus is 32-bit, word addressed: a write is taken in the cycle ``w_stb`` is high
(registered, then decoded: it lands :data:`WRITE_LATENCY` cycles later); ``r_data`` shows
the register at ``addr`` :data:`READ_LATENCY` cycles later (0 where there is no register).
"""

from dataclasses import dataclass
import ipaddress

from .counters import GATEWARE_COUNTERS

__all__ = ["Reg", "GLOBAL_REGS", "LEAF_GLOBAL_REGS", "parent_writes", "JOB_REGS", "MEMBER_REGS", "COUNTER_NAMES",
           "JOB_BASE", "JOB_STRIDE", "MEMBER_BASE", "COUNTER_BASE", "ID_VALUE",
           "job_reg_addr", "member_reg_addr", "counter_addr", "config_writes",
           "register_map_text", "READ_LATENCY", "WRITE_LATENCY"]


@dataclass(frozen=True)
class Reg:
    name: str
    offset: int
    width: int
    access: str  # "rw", "ro", "w" (write strobe: action)
    doc: str


ID_VALUE = 0x494E4101  # "INA" v1

GLOBAL_REGS = (
    Reg("id", 0x000, 32, "ro", "0x494E4101 ('INA', version 1)"),
    Reg("params", 0x001, 32, "ro", "lanes | jobs<<8 | workers<<16 | log2(window)<<24"),
    Reg("src_ip", 0x002, 32, "rw", "IPv4 source address of RESULT frames (for the header checksum)"),
    Reg("now", 0x003, 32, "ro", "cycle counter (the time base of deadlines)"),
    # a leaf of a tree of switches (a core built with ``CoreParams.leaf``; docs/fabric.md):
    # the parent switch, one per core (as ``ina switch --parent``)
    Reg("parent_ip", 0x004, 32, "rw", "the parent switch's IPv4 address (leaf=True): the "
        "partial sums of jobs with ``parent`` 1 go there, its RESULTs come from there"),
    Reg("parent_port", 0x005, 16, "rw", "the parent switch's UDP port (leaf=True)"),
    Reg("parent_mac_hi", 0x006, 16, "rw", "the parent's (or the next hop's) MAC, top 16 "
        "bits (leaf=True; latched, written with parent_mac_lo)"),
    Reg("parent_mac_lo", 0x007, 32, "rw", "the parent's MAC, low 32 bits (leaf=True)"),
)
#: the global registers of a leaf (``CoreParams.leaf``): constant 0 in a core without it
LEAF_GLOBAL_REGS = ("parent_ip", "parent_port", "parent_mac_hi", "parent_mac_lo")

COUNTER_BASE = 0x040
#: the gateware's counters, in register order (defined once, with the model's and the C
#: engine's: ``ina_fabric.protocol.counters``)
COUNTER_NAMES = GATEWARE_COUNTERS

JOB_BASE, JOB_STRIDE = 0x100, 0x10
JOB_REGS = (
    Reg("job_id", 0, 16, "rw", "job id (the header's job field)"),
    Reg("nworkers", 1, 6, "rw", "N, workers in the job (1..workers)"),
    Reg("bounded", 2, 1, "rw", "1: bounded mode (deadline emits PARTIAL); 0: reliable"),
    Reg("log2_window", 3, 5, "rw", "log2 of the job's window W (W <= core window)"),
    Reg("elements", 4, 15, "rw", "most elements per packet (<= core elements)"),
    Reg("deadline", 5, 32, "rw", "deadline in core clock cycles after a slot opens"),
    Reg("mcast_en", 6, 1, "rw", "1: one RESULT to the multicast group; 0: one per member"),
    Reg("mcast_ip", 7, 32, "rw", "IPv4 multicast group address"),
    Reg("mcast_port", 8, 16, "rw", "UDP port of the multicast group"),
    Reg("enable", 9, 1, "rw", "write 1: queue a reset of the job's slots, then enable it "
        "(reads 1 once done); 0: disable (cancels a queued or running reset)"),
    Reg("session_hi", 10, 32, "rw", "the run's session id, top 32 bits (DATA must carry it)"),
    Reg("session_lo", 11, 32, "rw", "the run's session id, low 32 bits"),
    # a spine of a tree of switches (a core built with ``CoreParams.tree``; docs/fabric.md)
    Reg("children", 12, 1, "rw", "1: the members are child switches, whose DATA's count "
        "is the workers each covers (a core built with tree=True); 0: workers"),
    Reg("total_workers", 13, 11, "rw", "the job's workers (children = 1): its RESULT is "
        "PARTIAL when it covers fewer"),
    # a leaf (a core built with ``CoreParams.leaf``)
    Reg("parent", 14, 1, "rw", "1: the job has a parent switch (the parent_* registers; a "
        "core built with leaf=True): a slot that closes sends its partial sum up as DATA "
        "and relays the parent's RESULT to the members"),
    Reg("up_index", 15, 5, "rw", "this switch's member id in the parent's job (parent = 1)"),
)

MEMBER_BASE = 0x1000
MEMBER_REGS = (
    Reg("ip", 0, 32, "rw", "member IPv4 address"),
    Reg("port", 1, 16, "rw", "member UDP port"),
    Reg("mac_hi", 2, 16, "rw", "member MAC, top 16 bits (latched; written with mac_lo)"),
    Reg("mac_lo", 3, 32, "rw", "member MAC, low 32 bits"),
)


def job_reg_addr(job_index: int, name: str) -> int:
    reg = next(r for r in JOB_REGS if r.name == name)
    return JOB_BASE + job_index * JOB_STRIDE + reg.offset


def member_reg_addr(job_index: int, worker: int, name: str) -> int:
    reg = next(r for r in MEMBER_REGS if r.name == name)
    return MEMBER_BASE + (job_index * 32 + worker) * 4 + reg.offset


def counter_addr(name: str) -> int:
    return COUNTER_BASE + COUNTER_NAMES.index(name)


def config_writes(cfg, job_index: int, *, clock_hz: float, window_max: int,
                  elements_max: int, workers_max: int = 32,
                  deadline_cycles: int | None = None,
                  tree: bool = False, leaf: bool = False) -> list[tuple[int, int]]:
    """Register writes ``[(addr, value)]`` that load ``cfg`` (a ina_fabric.protocol.jobtable
    JobConfig) into job-table entry ``job_index``; the last write enables the job.

    Raises ValueError when the job does not fit the core (window not a power of two or
    above the core's window, too many elements or workers), when it has a parent and the
    core was not built with ``leaf`` (docs/gateware.md, "Trees of switches"; the parent's
    address goes into the global registers: :func:`parent_writes`), or when its members
    are child switches and the core was not built with ``tree`` (``CoreParams``)."""
    w = cfg.window
    if w & (w - 1) or w > window_max:
        raise ValueError(f"job {cfg.job}: window {w} must be a power of two <= {window_max}")
    if cfg.elements > elements_max:
        raise ValueError(f"job {cfg.job}: elements {cfg.elements} > core elements {elements_max}")
    if cfg.n > workers_max:
        raise ValueError(f"job {cfg.job}: {cfg.n} workers > core workers {workers_max}")
    if getattr(cfg, "parent", None) is not None and not leaf:
        raise ValueError(f"job {cfg.job}: has a parent switch; this core was built without "
                         f"the leaf option (CoreParams(tree=True, leaf=True); "
                         f"docs/gateware.md)")
    children = bool(getattr(cfg, "children", False))
    if children and not tree:
        raise ValueError(f"job {cfg.job}: its members are child switches; this core was "
                         f"built without the tree option (CoreParams(tree=True); ina hw-config "
                         f"--core-tree)")
    if deadline_cycles is None:
        deadline_cycles = max(1, round(cfg.deadline * clock_hz))
    if not 1 <= deadline_cycles < 1 << 31:
        raise ValueError(f"job {cfg.job}: deadline of {deadline_cycles} cycles out of range")
    out = [(job_reg_addr(job_index, "enable"), 0)]
    vals = {
        "job_id": cfg.job, "nworkers": cfg.n, "bounded": int(cfg.mode == "bounded"),
        "log2_window": w.bit_length() - 1, "elements": cfg.elements,
        "deadline": deadline_cycles, "mcast_en": int(cfg.mcast is not None),
        "mcast_ip": int(ipaddress.IPv4Address(cfg.mcast[0])) if cfg.mcast else 0,
        "mcast_port": cfg.mcast[1] if cfg.mcast else 0,
        "session_hi": cfg.session >> 32, "session_lo": cfg.session & 0xFFFFFFFF,
    }
    if tree:
        vals |= {"children": int(children), "total_workers": cfg.total if children else cfg.n}
    if leaf:
        parent = getattr(cfg, "parent", None)
        vals |= {"parent": int(parent is not None),
                 "up_index": cfg.index if parent is not None else 0}
    out += [(job_reg_addr(job_index, k), v) for k, v in vals.items()]
    for i, m in enumerate(cfg.members):
        mac = int(m.mac.replace(":", ""), 16)
        out += [(member_reg_addr(job_index, i, "ip"), int(ipaddress.IPv4Address(m.ip))),
                (member_reg_addr(job_index, i, "port"), m.port),
                (member_reg_addr(job_index, i, "mac_hi"), mac >> 32),
                (member_reg_addr(job_index, i, "mac_lo"), mac & 0xFFFFFFFF)]
    out.append((job_reg_addr(job_index, "enable"), 1))
    return out


def parent_writes(parent, mac: str) -> list[tuple[int, int]]:
    """Register writes ``[(addr, value)]`` that set a leaf core's parent switch
    (``CoreParams.leaf``): ``parent`` ``(ip, port)``, ``mac`` its (or the next hop's)
    MAC as ``aa:bb:cc:dd:ee:ff``. One parent per core, as ``ina switch --parent``: every
    job with ``parent`` 1 sends its partial sums there."""
    addr = {r.name: r.offset for r in GLOBAL_REGS}
    m = int(mac.replace(":", ""), 16)
    return [(addr["parent_ip"], int(ipaddress.IPv4Address(parent[0]))),
            (addr["parent_port"], int(parent[1])),
            (addr["parent_mac_hi"], m >> 32), (addr["parent_mac_lo"], m & 0xFFFFFFFF)]


def register_map_text() -> str:
    """The register map as a Markdown table (for docs/gateware.md)."""
    rows = ["| address | name | bits | access | meaning |", "|---|---|---|---|---|"]
    for r in GLOBAL_REGS:
        rows.append(f"| 0x{r.offset:03x} | {r.name} | {r.width} | {r.access} | {r.doc} |")
    for i, n in enumerate(COUNTER_NAMES):
        rows.append(f"| 0x{COUNTER_BASE + i:03x} | {n} | 32 | ro | counter |")
    for r in JOB_REGS:
        rows.append(f"| 0x{JOB_BASE:03x} + 0x{JOB_STRIDE:x}*j + {r.offset} | job.{r.name} | "
                    f"{r.width} | {r.access} | {r.doc} |")
    for r in MEMBER_REGS:
        rows.append(f"| 0x{MEMBER_BASE:04x} + 4*(32*j + w) + {r.offset} | member.{r.name} | "
                    f"{r.width} | {r.access} | {r.doc} |")
    return "\n".join(rows)


#: cycles from ``w_stb`` until the register holds the value (the core registers the bus,
#: then the decoded strobe)
WRITE_LATENCY = 2
#: cycles from ``addr`` until ``r_data`` shows the register (bus register, group
#: register, output register)
READ_LATENCY = 3
