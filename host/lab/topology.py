"""Lab topologies: what namespaces, bridges and links a lab has, read from TOML.

A topology file has ``[params]`` (defaults that ``--set name=value`` overrides), any
number of ``[[switch]]`` tables (a namespace holding a bridge, with a subnet) and
``[[hosts]]`` groups (``count`` hosts named ``prefix0 ..``, each with one link to a
switch's bridge). A string value ``"$name"`` stands for the parameter ``name``.
``rack.toml`` is the built-in example; ``load("rack")`` finds a built-in by name and
anything else as a path. Two tables generate whole topologies: ``[islands]`` (``wan9``:
the schedule optimizer's islands, joined by delayed WAN links) and ``[fabric]``
(``fabric``: racks of hosts under top-of-rack switches, oversubscribed uplinks to a
spine).

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

__all__ = ["TopologyError", "LinkSpec", "SwitchSpec", "HostSpec", "WanLinkSpec", "Topology",
           "load",
           "builtin_names", "parse_rate", "format_rate", "LAB_NET", "MAX_HOSTS", "MAX_RACKS"]

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


@dataclass(frozen=True)
class WanLinkSpec:
    """A routed link between two switch namespaces (islands): a /30, the first address
    on ``a``'s side; always through the delay line (TAPs named ``w<peer>``)."""
    a: str
    b: str
    subnet: ipaddress.IPv4Network
    link: LinkSpec

    @property
    def addresses(self):
        first = self.subnet.network_address + 1
        return first, first + 1


@dataclass
class Topology:
    name: str
    description: str = ""
    params: dict = field(default_factory=dict)
    switches: list[SwitchSpec] = field(default_factory=list)
    hosts: list[HostSpec] = field(default_factory=list)
    wan: list[WanLinkSpec] = field(default_factory=list)
    routes: dict = field(default_factory=dict)   # switch -> {dest switch: via switch}
    labels: dict = field(default_factory=dict)   # node -> what it stands for (a city)
    racks: list[str] = field(default_factory=list)   # a fabric's top-of-rack switches
    spine: str | None = None                         # a fabric's spine switch
    oversubscription: float | None = None            # a fabric's: rack hosts' / uplink

    def rack_hosts(self, tor: str) -> list[str]:
        """The hosts under switch ``tor``, in order (a fabric's rack)."""
        return [h.name for h in self.hosts if h.switch == tor]

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
                          for h in self.hosts],
                "wan": [{"a": w.a, "b": w.b, "subnet": str(w.subnet), "rate": w.link.rate,
                         "delay_ms": w.link.delay_ms, "jitter_ms": w.link.jitter_ms,
                         "loss": w.link.loss, "mtu": w.link.mtu, "queue_ms": w.link.queue_ms}
                        for w in self.wan],
                "routes": self.routes, "labels": self.labels, "racks": self.racks,
                "spine": self.spine, "oversubscription": self.oversubscription}


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


def _link(g, val=lambda v: v) -> LinkSpec:
    link = LinkSpec(rate=parse_rate(val(g["rate"])),
                    delay_ms=float(val(g.get("delay_ms", 0.0))),
                    jitter_ms=float(val(g.get("jitter_ms", 0.0))),
                    loss=float(val(g.get("loss", 0.0))),
                    mtu=int(val(g.get("mtu", 1500))),
                    queue_ms=float(val(g.get("queue_ms", 20.0))))
    if not 0 <= link.loss < 1 or link.delay_ms < 0 or link.jitter_ms < 0:
        raise TopologyError("links: need 0 <= loss < 1, delay_ms >= 0, jitter_ms >= 0")
    if not 576 <= link.mtu <= 65000:
        raise TopologyError(f"links: mtu {link.mtu} outside 576..65000")
    return link


def _islands(topo, spec, used):
    """Islands from a WAN topology of the schedule optimizer (``from = "default"`` or a
    file): island k is switch ``i<k>`` (subnet k of ``subnet``, a /24 each) with
    ``hosts`` hosts ``i<k>h0 ..``; every WAN link of that topology becomes a routed link
    between the two islands' switches with its one-way latency x ``delay_scale`` as
    delay; routes follow the optimizer's shortest paths."""
    from ina_fabric.host.schedule.topology import default_topology, load_topology
    src = spec.get("from", "default")
    wt = default_topology() if src == "default" else load_topology(src)
    if wt.n > 64:
        raise TopologyError(f"islands: {wt.n} islands, at most 64")
    subnets = list(ipaddress.ip_network(spec.get("subnet", "198.18.0.0/16")).subnets(new_prefix=24))
    p2p = ipaddress.ip_network(spec.get("links_subnet", "198.19.0.0/16")).subnets(new_prefix=30)
    for net in (subnets[0], ipaddress.ip_network(spec.get("links_subnet", "198.19.0.0/16"))):
        if not net.subnet_of(LAB_NET):
            raise TopologyError(f"islands: subnet {net} is outside {LAB_NET}")
    host_link = _link({k.removeprefix("host_"): v for k, v in spec.items()
                       if k.startswith("host_")})
    wan = {k.removeprefix("wan_"): v for k, v in spec.items() if k.startswith("wan_")}
    count = int(spec.get("hosts", 1))
    if not 0 <= count <= MAX_HOSTS:
        raise TopologyError(f"islands: hosts {count} outside 0..{MAX_HOSTS}")
    scale = float(spec.get("delay_scale", 1.0))
    names = [f"i{k}" for k in range(wt.n)]
    topo.description = topo.description or f"{wt.n} islands: {', '.join(wt.names)}"
    topo.labels.update(zip(names, wt.names))
    for k, name in enumerate(names):
        sw = SwitchSpec(name, subnets[k])
        topo.switches.append(sw)
        for h in range(count):
            topo.hosts.append(HostSpec(f"{name}h{h}", name,
                                       sw.subnet.network_address + h + 1, host_link))
        used[name] = count
    for (i, j) in sorted(wt.links):
        link = _link({**wan, "delay_ms": float(wt.hop_latency[i, j]) * 1e3 * scale})
        topo.wan.append(WanLinkSpec(names[i], names[j], next(p2p), link))
    for i in range(wt.n):
        topo.routes[names[i]] = {names[j]: names[wt.path_links(i, j)[0][1]]
                                 for j in range(wt.n) if j != i}


MAX_RACKS = 32


def _fabric(topo, spec, used):
    """Racks under a spine: rack k is switch ``t<k>`` (the k-th /24 of ``subnet``) with
    ``hosts`` hosts ``r<k>h0 ..`` on ``host_*`` links; the spine ``sp`` holds the last
    /24 (a bridge with no port: its address is the spine switch's); each rack has one
    routed uplink to the spine (a /30 of ``links_subnet``, a veth pair with tbf both
    ways) at ``uplink_rate``, or hosts x host rate / ``oversubscription``."""
    racks, count = int(spec.get("racks", 1)), int(spec.get("hosts", 1))
    if not 1 <= racks <= MAX_RACKS:
        raise TopologyError(f"fabric: racks {racks} outside 1..{MAX_RACKS}")
    if not 1 <= count <= MAX_HOSTS:
        raise TopologyError(f"fabric: hosts per rack {count} outside 1..{MAX_HOSTS}")
    net = ipaddress.ip_network(spec.get("subnet", "198.18.0.0/16"))
    links = ipaddress.ip_network(spec.get("links_subnet", "198.19.0.0/16"))
    for n in (net, links):
        if not n.subnet_of(LAB_NET):
            raise TopologyError(f"fabric: subnet {n} is outside {LAB_NET}")
    subnets = list(net.subnets(new_prefix=24)) if net.prefixlen <= 24 else []
    p2p = list(links.subnets(new_prefix=30)) if links.prefixlen <= 30 else []
    if len(subnets) < racks + 1 or len(p2p) < racks:
        raise TopologyError(f"fabric: {net} and {links} hold fewer than {racks} racks")
    host_link = _link({k.removeprefix("host_"): v for k, v in spec.items()
                       if k.startswith("host_")})
    over = float(spec.get("oversubscription", 1.0))
    if not over > 0:
        raise TopologyError(f"fabric: oversubscription {over} must be positive")
    explicit = str(spec.get("uplink_rate", "") or "").strip()
    up_rate = parse_rate(explicit) if explicit else int(round(count * host_link.rate / over))
    up = {k.removeprefix("uplink_"): v for k, v in spec.items()
          if k.startswith("uplink_") and k != "uplink_rate"}
    up_link = _link({**up, "rate": up_rate})
    topo.oversubscription = count * host_link.rate / up_rate
    spine = SwitchSpec("sp", subnets[-1])
    for k in range(racks):
        sw = SwitchSpec(f"t{k}", subnets[k])
        topo.switches.append(sw)
        topo.racks.append(sw.name)
        for h in range(count):
            topo.hosts.append(HostSpec(f"r{k}h{h}", sw.name,
                                       sw.subnet.network_address + h + 1, host_link))
        used[sw.name] = count
        topo.wan.append(WanLinkSpec(sw.name, spine.name, p2p[k], up_link))
        topo.labels[sw.name] = f"rack {k}"
    topo.switches.append(spine)
    topo.spine, topo.labels["sp"] = spine.name, "spine"
    used[spine.name] = 0
    for t in topo.racks:
        topo.routes[t] = {**{o: spine.name for o in topo.racks if o != t},
                          spine.name: spine.name}
    topo.routes[spine.name] = {t: t for t in topo.racks}
    topo.description = topo.description or \
        f"{racks} racks x {count} hosts, uplinks {format_rate(up_rate)} " \
        f"({topo.oversubscription:g}:1)"


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
    if "islands" in doc:
        _islands(topo, {k: val(v) for k, v in doc["islands"].items()}, used)
    if "fabric" in doc:
        _fabric(topo, {k: val(v) for k, v in doc["fabric"].items()}, used)
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
        link = _link(g, val)
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
    if not topo.switches or not (topo.hosts or topo.wan):
        raise TopologyError("a topology needs at least one switch and one host or link")
    return topo
