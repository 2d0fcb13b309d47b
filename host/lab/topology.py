"""Lab topologies: what namespaces, bridges and links a lab has, read from TOML.

A topology file has ``[params]`` (defaults that ``--set name=value`` overrides), any
number of ``[[switch]]`` tables (a namespace holding a bridge, with a subnet) and
``[[hosts]]`` groups (``count`` hosts named ``prefix0 ..``, each with one link to a
switch's bridge). A string value ``"$name"`` stands for the parameter ``name``.
``rack.toml`` is the built-in example; ``load("rack")`` finds a built-in by name and
anything else as a path.

Rates are bits per second, decimal as in ``tc``: ``100mbit`` = 10^8 bit/s, ``1gbit``,
``500kbit``, or a plain number. Every address is in 198.18.0.0/15 (RFC 2544 benchmark
space); a subnet outside it is refused.
"""

from dataclasses import dataclass, field
import ipaddress
import pathlib
import re
import tomllib

from ina_fabric.paths import resource

__all__ = ["TopologyError", "LinkSpec", "SwitchSpec", "HostSpec", "Topology", "load",
           "builtin_names", "parse_rate", "format_rate", "LAB_NET", "MAX_HOSTS"]

LAB_NET = ipaddress.ip_network("198.18.0.0/15")
MAX_HOSTS = 16
_RATE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(k|m|g)?(bit)?\s*", re.I)
_UNIT = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}
_NAME = re.compile(r"[a-z][a-z0-9]{0,5}")


class TopologyError(ValueError):
    """A topology file or parameter that cannot be built; the message says which."""


def parse_rate(text) -> int:
    """Bits per second from ``1gbit``, ``100mbit``, ``500kbit``, ``1e9`` (decimal, as tc)."""
    m = _RATE.fullmatch(str(text))
    if not m:
        raise TopologyError(f"bad rate {text!r}: use e.g. 100mbit, 1gbit, 500kbit or bit/s")
    rate = int(round(float(m.group(1)) * _UNIT[(m.group(2) or "").lower()]))
    if rate <= 0:
        raise TopologyError(f"bad rate {text!r}: must be positive")
    return rate


def format_rate(bits: int) -> str:
    for unit, div in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bits >= div and bits % div == 0:
            return f"{bits // div}{unit}"
    return f"{bits}bit"


@dataclass(frozen=True)
class LinkSpec:
    """One link: ``rate`` bit/s each way (tbf on both ends), and, when ``delay_ms`` or
    ``jitter_ms`` or ``loss`` is set, the userspace delay line between two TAPs in place
    of a veth pair. ``queue_ms``: each end's tbf queue, in milliseconds at ``rate``."""
    rate: int
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss: float = 0.0
    mtu: int = 1500
    queue_ms: float = 20.0

    @property
    def impaired(self) -> bool:
        return bool(self.delay_ms or self.jitter_ms or self.loss)

    @property
    def queue_bytes(self) -> int:
        return int(self.rate / 8 * self.queue_ms / 1e3)


@dataclass(frozen=True)
class SwitchSpec:
    name: str
    subnet: ipaddress.IPv4Network

    @property
    def address(self) -> ipaddress.IPv4Address:
        """The bridge's address: the last usable one of the subnet."""
        return self.subnet.broadcast_address - 1


@dataclass(frozen=True)
class HostSpec:
    name: str
    switch: str
    address: ipaddress.IPv4Address
    link: LinkSpec


@dataclass
class Topology:
    name: str
    description: str = ""
    params: dict = field(default_factory=dict)
    switches: list[SwitchSpec] = field(default_factory=list)
    hosts: list[HostSpec] = field(default_factory=list)

    def host(self, name) -> HostSpec:
        for h in self.hosts:
            if h.name == name:
                return h
        raise TopologyError(f"no host {name!r} in {self.name}; have "
                            f"{', '.join(h.name for h in self.hosts)}")

    def switch(self, name=None) -> SwitchSpec:
        if name is None:
            return self.switches[0]
        for s in self.switches:
            if s.name == name:
                return s
        raise TopologyError(f"no switch {name!r} in {self.name}")

    @property
    def nodes(self) -> list[str]:
        """Every namespace's short name: switches first, then hosts."""
        return [s.name for s in self.switches] + [h.name for h in self.hosts]

    def to_dict(self) -> dict:
        return {"name": self.name, "params": self.params,
                "switches": [{"name": s.name, "subnet": str(s.subnet),
                              "address": str(s.address)} for s in self.switches],
                "hosts": [{"name": h.name, "switch": h.switch, "address": str(h.address),
                           "rate": h.link.rate, "delay_ms": h.link.delay_ms,
                           "jitter_ms": h.link.jitter_ms, "loss": h.link.loss,
                           "mtu": h.link.mtu, "queue_ms": h.link.queue_ms}
                          for h in self.hosts]}


def builtin_names() -> list[str]:
    return sorted(p.name.removesuffix(".toml")
                  for p in resource("ina_fabric.host.lab", "").iterdir()
                  if p.name.endswith(".toml"))


def _coerce(value, like):
    """A --set string as the type of the parameter's default."""
    if isinstance(like, bool):
        return str(value).lower() in ("1", "true", "yes")
    if isinstance(like, int):
        return int(value)
    if isinstance(like, float):
        return float(value)
    return str(value)


def load(name_or_path, overrides: dict | None = None) -> Topology:
    """A built-in topology by name (``rack``) or a TOML file; ``overrides`` set params."""
    text = str(name_or_path)
    try:
        if text in builtin_names():
            raw = resource("ina_fabric.host.lab", f"{text}.toml").read_text()
        else:
            raw = pathlib.Path(text).read_text()
        doc = tomllib.loads(raw)
    except FileNotFoundError:
        raise TopologyError(f"no topology {text!r}: give a built-in "
                            f"({', '.join(builtin_names())}) or a TOML file") from None
    except tomllib.TOMLDecodeError as e:
        raise TopologyError(f"{text}: {e}") from None
    return from_dict(doc, overrides or {})


def from_dict(doc: dict, overrides: dict) -> Topology:
    params = dict(doc.get("params", {}))
    for k, v in overrides.items():
        if k not in params:
            raise TopologyError(f"unknown parameter {k!r}; have {', '.join(params)}")
        try:
            params[k] = _coerce(v, params[k])
        except ValueError:
            raise TopologyError(f"bad value {v!r} for parameter {k!r}") from None

    def val(v):
        if isinstance(v, str) and v.startswith("$"):
            if v[1:] not in params:
                raise TopologyError(f"{v}: no such parameter")
            return params[v[1:]]
        return v

    topo = Topology(name=str(doc.get("name", "lab")), description=doc.get("description", ""),
                    params=params)
    used = {}
    for s in doc.get("switch", []):
        name = str(s["name"])
        try:
            subnet = ipaddress.ip_network(val(s["subnet"]))
        except ValueError as e:
            raise TopologyError(f"switch {name}: {e}") from None
        if not subnet.subnet_of(LAB_NET):
            raise TopologyError(f"switch {name}: subnet {subnet} is outside {LAB_NET}")
        topo.switches.append(SwitchSpec(name, subnet))
        used[name] = 0
    for g in doc.get("hosts", []):
        sw = topo.switch(str(val(g["switch"])))
        count = int(val(g.get("count", 1)))
        if not 1 <= count <= MAX_HOSTS:
            raise TopologyError(f"hosts: count {count} outside 1..{MAX_HOSTS}")
        link = LinkSpec(rate=parse_rate(val(g["rate"])),
                        delay_ms=float(val(g.get("delay_ms", 0.0))),
                        jitter_ms=float(val(g.get("jitter_ms", 0.0))),
                        loss=float(val(g.get("loss", 0.0))),
                        mtu=int(val(g.get("mtu", 1500))),
                        queue_ms=float(val(g.get("queue_ms", 20.0))))
        if not 0 <= link.loss < 1 or link.delay_ms < 0 or link.jitter_ms < 0:
            raise TopologyError("hosts: need 0 <= loss < 1, delay_ms >= 0, jitter_ms >= 0")
        if not 576 <= link.mtu <= 65000:
            raise TopologyError(f"hosts: mtu {link.mtu} outside 576..65000")
        for i in range(count):
            used[sw.name] += 1
            addr = sw.subnet.network_address + used[sw.name]
            if addr >= sw.address:
                raise TopologyError(f"switch {sw.name}: subnet {sw.subnet} is too small")
            topo.hosts.append(HostSpec(f"{g['prefix']}{i}", sw.name, addr, link))
    for n in topo.nodes:
        if not _NAME.fullmatch(n):
            raise TopologyError(f"node name {n!r}: 1..6 lowercase letters and digits")
    if len(set(topo.nodes)) != len(topo.nodes):
        raise TopologyError("node names repeat")
    if not topo.switches or not topo.hosts:
        raise TopologyError("a topology needs at least one switch and one host")
    return topo
