"""WAN topology: islands in cities, their access bandwidth, backbone links, latencies.

A topology file is TOML or JSON with the same keys (see ``default_topology.toml``)::

    route_factor = 1.45          # fibre route length / great-circle distance
    fibre_speed_m_s = 2.0e8
    lan_latency_us = 5.0         # colocated baseline
    bandwidth_gbps = 100.0       # default per-island access bandwidth
    link_capacity_gbps = 400.0   # default per-link backbone capacity
    [[island]]                   # one per island
    name = "Tokyo"               # city = "Tokyo" implied; or lat = .., lon = ..
    bandwidth_gbps = 100.0       # optional
    address = "10.1.0.1:47000"   # optional: the island's aggregation endpoint
    [[link]]                     # optional; none at all = full mesh
    a = "Tokyo"
    b = "Los Angeles"
    capacity_gbps = 400.0        # optional

One-way latency of a link is great-circle distance x route_factor / fibre_speed; with
explicit links, the latency between two islands is that of the shortest path.
"""

from dataclasses import dataclass, field
import json
import pathlib
import tomllib

import numpy as np

from ina_fabric.paths import resource

from .cities import CITIES, great_circle_m

__all__ = ["WanTopology", "WanTopologyError", "load_topology", "default_topology",
           "DEFAULT_TOPOLOGY_PATH", "synthetic_topology"]

# package data, found through importlib.resources (a plain file in any non-zip install)
DEFAULT_TOPOLOGY_PATH = pathlib.Path(str(resource("ina_fabric.host.schedule", "default_topology.toml")))
_TOP_KEYS = {"route_factor", "fibre_speed_m_s", "lan_latency_us", "bandwidth_gbps",
             "link_capacity_gbps", "island", "link", "name"}
_ISLAND_KEYS = {"name", "city", "lat", "lon", "bandwidth_gbps", "address"}
_LINK_KEYS = {"a", "b", "capacity_gbps"}


class WanTopologyError(ValueError):
    """A topology that cannot be used; the message names the file and the problem."""


@dataclass
class WanTopology:
    """Islands (index order = file order) and the network between them.

    ``bandwidth`` is bytes/s per island (access link, each direction); ``links`` maps an
    undirected island pair ``(i, j)``, ``i < j``, to its capacity in bytes/s.
    """
    names: list[str]
    lat: np.ndarray
    lon: np.ndarray
    bandwidth: np.ndarray
    links: dict[tuple[int, int], float]
    route_factor: float = 1.45
    fibre_speed: float = 2.0e8
    lan_latency: float = 5e-6
    addresses: list[str | None] = field(default_factory=list)
    source: str = "<memory>"

    def __post_init__(self):
        self.lat = np.asarray(self.lat, float)
        self.lon = np.asarray(self.lon, float)
        self.bandwidth = np.asarray(self.bandwidth, float)
        if not self.addresses:
            self.addresses = [None] * self.n
        self._validate()
        self._route()

    @property
    def n(self) -> int:
        return len(self.names)

    def _fail(self, msg):
        raise WanTopologyError(f"{self.source}: {msg}")

    def _validate(self):
        n = self.n
        if n < 2:
            self._fail(f"need at least 2 islands, have {n}")
        if len(set(self.names)) != n:
            dup = sorted({x for x in self.names if self.names.count(x) > 1})
            self._fail(f"duplicate island names {dup}")
        if not (np.all(np.abs(self.lat) <= 90) and np.all(np.abs(self.lon) <= 180)):
            self._fail("latitude must be in [-90, 90] and longitude in [-180, 180]")
        for name, bw in zip(self.names, self.bandwidth):
            if not np.isfinite(bw) or bw <= 0:
                self._fail(f"island {name!r}: bandwidth must be positive, got {bw * 8 / 1e9:g} Gb/s")
        for (i, j), cap in self.links.items():
            if not np.isfinite(cap) or cap <= 0:
                self._fail(f"link {self.names[i]!r}-{self.names[j]!r}: capacity must be "
                           f"positive, got {cap * 8 / 1e9:g} Gb/s")
        if not 1.0 <= self.route_factor <= 5.0:
            self._fail(f"route_factor {self.route_factor} outside [1, 5]")
        if not 1e7 <= self.fibre_speed <= 3e8:
            self._fail(f"fibre_speed_m_s {self.fibre_speed} outside [1e7, 3e8]")
        if self.lan_latency < 0:
            self._fail("lan_latency_us must be >= 0")

    def _route(self):
        """Shortest-latency paths over the links (Dijkstra via scipy)."""
        from scipy.sparse import csr_matrix
        from scipy.sparse.csgraph import shortest_path, connected_components
        n = self.n
        d = great_circle_m(self.lat[:, None], self.lon[:, None], self.lat[None], self.lon[None])
        self.distance_m = d
        hop = d * self.route_factor / self.fibre_speed
        ij = np.array(sorted(self.links), dtype=int).reshape(-1, 2)
        # a zero-length hop (two islands in one metro) still costs a LAN latency
        # a zero-length hop (two islands in one metro) still costs a LAN latency
        self.hop_latency = np.maximum(hop, max(self.lan_latency, 1e-9))
        w = self.hop_latency[ij[:, 0], ij[:, 1]]
        g = csr_matrix((np.r_[w, w], (np.r_[ij[:, 0], ij[:, 1]], np.r_[ij[:, 1], ij[:, 0]])),
                       shape=(n, n))
        ncomp, label = connected_components(g, directed=False)
        if ncomp > 1:
            parts = [[self.names[i] for i in np.flatnonzero(label == c)] for c in range(ncomp)]
            self._fail(f"disconnected graph: {ncomp} components {parts}")
        lat, pred = shortest_path(g, method="D", directed=False, return_predecessors=True)
        np.fill_diagonal(lat, 0.0)
        self.latency = lat            # one-way seconds, (n, n)
        self._pred = pred

    def path_links(self, src: int, dst: int) -> list[tuple[int, int]]:
        """Directed hops (a, b) on the routed path src -> dst."""
        hops, j = [], dst
        while j != src:
            i = int(self._pred[src, j])
            hops.append((i, j))
            j = i
        return hops[::-1]

    def link_capacity(self, a: int, b: int) -> float:
        return self.links[(min(a, b), max(a, b))]

    @property
    def full_mesh(self) -> bool:
        return len(self.links) == self.n * (self.n - 1) // 2

    def rtt_ms(self, a: str, b: str) -> float:
        i, j = self.names.index(a), self.names.index(b)
        return 2e3 * self.latency[i, j]

    def colocated(self) -> "WanTopology":
        """The same islands in one building: LAN latency, same bandwidths."""
        t = WanTopology.__new__(WanTopology)
        t.__dict__.update(self.__dict__)
        n = self.n
        t.latency = np.full((n, n), self.lan_latency)
        np.fill_diagonal(t.latency, 0.0)
        t.hop_latency = t.latency.copy()
        t.links = {(i, j): max(self.links.values()) for i in range(n) for j in range(i + 1, n)}
        t._pred = np.tile(np.arange(n)[:, None], (1, n))  # direct hops
        t.source = self.source + " (colocated)"
        return t

    def describe(self) -> str:
        lines = [f"{self.n} islands from {self.source} (route factor {self.route_factor}, "
                 f"{'full mesh' if self.full_mesh else f'{len(self.links)} links'})"]
        for i, nm in enumerate(self.names):
            far = int(np.argmax(self.latency[i]))
            lines.append(f"  {nm:14s} {self.bandwidth[i] * 8 / 1e9:6.0f} Gb/s   farthest "
                         f"{self.names[far]} {2e3 * self.latency[i, far]:.0f} ms RTT")
        return "\n".join(lines)


def _num(src, where, key, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise WanTopologyError(f"{src}: {where}: {key} must be a number, got {value!r}")
    return float(value)


def topology_from_dict(doc: dict, source: str = "<dict>") -> WanTopology:
    if not isinstance(doc, dict):
        raise WanTopologyError(f"{source}: top level must be a table/object")
    unknown = set(doc) - _TOP_KEYS
    if unknown:
        raise WanTopologyError(f"{source}: unknown keys {sorted(unknown)}")
    g = lambda k, d: _num(source, "top level", k, doc.get(k, d))
    rf, speed = g("route_factor", 1.45), g("fibre_speed_m_s", 2.0e8)
    lan, bw0, cap0 = g("lan_latency_us", 5.0), g("bandwidth_gbps", 100.0), g("link_capacity_gbps", 400.0)
    islands = doc.get("island")
    if not isinstance(islands, list) or not islands:
        raise WanTopologyError(f"{source}: no [[island]] tables")
    names, lat, lon, bw, addr = [], [], [], [], []
    for k, isl in enumerate(islands):
        if not isinstance(isl, dict) or "name" not in isl:
            raise WanTopologyError(f"{source}: island #{k + 1} needs a name")
        name = str(isl["name"])
        bad = set(isl) - _ISLAND_KEYS
        if bad:
            raise WanTopologyError(f"{source}: island {name!r}: unknown keys {sorted(bad)}")
        if "lat" in isl or "lon" in isl:
            if not ("lat" in isl and "lon" in isl):
                raise WanTopologyError(f"{source}: island {name!r}: give both lat and lon")
            la, lo = _num(source, name, "lat", isl["lat"]), _num(source, name, "lon", isl["lon"])
        else:
            city = str(isl.get("city", name))
            if city not in CITIES:
                raise WanTopologyError(
                    f"{source}: island {name!r}: unknown city {city!r} (give lat/lon, or one "
                    f"of: {', '.join(sorted(CITIES))})")
            la, lo = CITIES[city]
        b = _num(source, name, "bandwidth_gbps", isl.get("bandwidth_gbps", bw0))
        if b <= 0:
            raise WanTopologyError(f"{source}: island {name!r}: negative or zero bandwidth {b:g} Gb/s")
        names.append(name), lat.append(la), lon.append(lo), bw.append(b * 1e9 / 8)
        addr.append(isl.get("address"))
    if bw0 <= 0 or cap0 <= 0:
        raise WanTopologyError(f"{source}: negative or zero default bandwidth/capacity")
    index = {nm: i for i, nm in enumerate(names)}
    links = {}
    raw = doc.get("link")
    if raw is None:
        links = {(i, j): cap0 * 1e9 / 8 for i in range(len(names)) for j in range(i + 1, len(names))}
    else:
        if not isinstance(raw, list):
            raise WanTopologyError(f"{source}: link must be an array of tables")
        for k, ln in enumerate(raw):
            if not isinstance(ln, dict) or "a" not in ln or "b" not in ln:
                raise WanTopologyError(f"{source}: link #{k + 1} needs a and b")
            bad = set(ln) - _LINK_KEYS
            if bad:
                raise WanTopologyError(f"{source}: link #{k + 1}: unknown keys {sorted(bad)}")
            for end in (ln["a"], ln["b"]):
                if end not in index:
                    raise WanTopologyError(f"{source}: link #{k + 1}: unknown island {end!r}")
            i, j = sorted((index[ln["a"]], index[ln["b"]]))
            if i == j:
                raise WanTopologyError(f"{source}: link #{k + 1}: a loop on {ln['a']!r}")
            c = _num(source, f"link #{k + 1}", "capacity_gbps", ln.get("capacity_gbps", cap0))
            if c <= 0:
                raise WanTopologyError(f"{source}: link {ln['a']!r}-{ln['b']!r}: negative or zero "
                                    f"capacity {c:g} Gb/s")
            links[(i, j)] = c * 1e9 / 8
    return WanTopology(names, np.array(lat), np.array(lon), np.array(bw), links, rf, speed,
                    lan * 1e-6, addr, source)


def load_topology(path) -> WanTopology:
    """A topology from a ``.toml`` or ``.json`` file (WanTopologyError on any problem)."""
    path = pathlib.Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise WanTopologyError(f"{path}: {e.strerror or e}") from None
    try:
        if path.suffix.lower() == ".json":
            doc = json.loads(raw)
        else:
            doc = tomllib.loads(raw.decode())
    except (json.JSONDecodeError, tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise WanTopologyError(f"{path}: cannot parse: {e}") from None
    name = path.name if path == DEFAULT_TOPOLOGY_PATH else str(path)
    return topology_from_dict(doc, name)


def default_topology() -> WanTopology:
    return load_topology(DEFAULT_TOPOLOGY_PATH)


def synthetic_topology(n: int, seed: int = 0, bandwidth_gbps: float = 100.0) -> WanTopology:
    """``n`` islands spread over the hub metros (several per metro, jittered ~50-300 km),
    for scaling tests and benchmarks."""
    rng = np.random.default_rng(seed)
    hubs = list(CITIES.items())
    names, lat, lon = [], [], []
    for k in range(n):
        city, (la, lo) = hubs[k % len(hubs)]
        names.append(f"{city}-{k // len(hubs) + 1}")
        lat.append(np.clip(la + rng.uniform(-2, 2), -89, 89))
        lon.append((lo + rng.uniform(-2, 2) + 180) % 360 - 180)
    links = {(i, j): 400e9 / 8 for i in range(n) for j in range(i + 1, n)}
    return WanTopology(names, np.array(lat), np.array(lon), np.full(n, bandwidth_gbps * 1e9 / 8),
                    links, source=f"synthetic-{n}-seed{seed}")
