"""A lab: a topology built in network namespaces, its services, and its teardown.

    with Lab(load("rack", {"hosts": 4, "rate": "100mbit"}), lab_id="t1") as lab:
        lab.start_switch()                       # `ina switch` on the bridge address
        p = lab.popen("h0", ["python", "-c", "..."])
        lab.run("h1", ["python", "-m", "..."], timeout=30)

Each lab has an id (1..8 lowercase letters or digits); its namespaces are
``inalab-<id>-<node>`` and its state (the topology, the services' pids, logs) lies in
``/run/ina-lab/<id>/``. :func:`down` needs only the id: it kills every process in the
lab's namespaces, then removes them (and with them every link, bridge, qdisc and TAP),
so a lab left behind by a crash is cleaned up the same way.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

from . import netns as N
from .topology import Topology

__all__ = ["Lab", "LabError", "down", "down_all", "list_labs", "STATE_DIR", "load_state"]

STATE_DIR = pathlib.Path("/run/ina-lab")
SWITCH_PORT = 19900


class LabError(RuntimeError):
    """A lab that cannot be built or used; the message says why."""


def _state_dir(lab_id) -> pathlib.Path:
    return STATE_DIR / lab_id


def load_state(lab_id) -> dict | None:
    try:
        return json.loads((_state_dir(lab_id) / "state.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def list_labs() -> list[str]:
    """Ids of the labs that exist now (namespaces or state left)."""
    ids = set(N.all_lab_ids())
    if STATE_DIR.is_dir():
        ids.update(p.name for p in STATE_DIR.iterdir() if p.is_dir())
    return sorted(ids)


def down(lab_id) -> dict:
    """Remove lab ``lab_id``: kill its processes, remove its namespaces and its state.
    Works from the names alone (after a crash too). Returns what it removed."""
    N.check_id(lab_id)
    names = N.lab_namespaces(lab_id)
    killed = N.kill_in(names)
    for n in names:
        N.remove_namespace(n)
    left = N.lab_namespaces(lab_id)
    shutil.rmtree(_state_dir(lab_id), ignore_errors=True)
    if left:
        raise LabError(f"lab {lab_id}: namespaces left after down: {', '.join(left)}")
    return {"lab": lab_id, "namespaces": len(names), "processes": killed}


def down_all() -> list[dict]:
    return [down(i) for i in list_labs()]


class Lab:
    """A topology built in namespaces. ``up()`` builds it (and tears down what it made
    if any step fails); ``down()`` removes it; as a context manager it does both."""

    def __init__(self, topology: Topology, lab_id: str = "0"):
        self.topo = topology
        self.id = N.check_id(lab_id)
        self.state_dir = _state_dir(lab_id)
        self.services = {}           # name -> {"pid", "node", "argv"}
        self.status = "new"          # building, up
        self._procs = {}             # name -> Popen (ours only)

    # -- naming --------------------------------------------------------------------
    def ns(self, node: str) -> str:
        if node not in self.topo.nodes:
            raise LabError(f"no node {node!r} in lab {self.id}; have "
                           f"{', '.join(self.topo.nodes)}")
        return N.ns_name(self.id, node)

    def address(self, node: str) -> str:
        """A node's address: a host's on its link, a switch's on its bridge."""
        if node in (s.name for s in self.topo.switches):
            return str(self.topo.switch(node).address)
        return str(self.topo.host(node).address)

    @property
    def hosts(self) -> list[str]:
        return [h.name for h in self.topo.hosts]

    @property
    def switch_address(self) -> tuple[str, int]:
        return self.address(self.topo.switches[0].name), SWITCH_PORT

    # -- build ---------------------------------------------------------------------
    def up(self):
        why = N.available()
        if why:
            raise LabError(f"cannot build a lab here: {why}")
        if N.lab_namespaces(self.id) or load_state(self.id):
            raise LabError(f"lab {self.id} exists already (`ina lab down --id {self.id}`)")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._save("building")
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        self._save("up")
        return self

    def _build(self):
        topo = self.topo
        for node in topo.nodes:
            N.create_namespace(self.ns(node))
        for node in topo.nodes:
            with N.ipr(self.ns(node)) as ip:
                N.link_up(ip, "lo")
        mtu = max(h.link.mtu for h in topo.hosts)
        for sw in topo.switches:
            with N.ipr(self.ns(sw.name)) as ip:
                ip.link("add", ifname="br0", kind="bridge")
                N.link_up(ip, "br0", mtu=mtu, address=sw.address,
                          prefixlen=sw.subnet.prefixlen)
        for h in topo.hosts:
            self._host_link(h)
        for w in topo.wan:
            self._wan_link(w)
        if topo.wan:
            self._routes()
        self._wait_carrier()

    def _host_link(self, h):
        """Host ``h``'s link: eth0 in its namespace, port ``h.name`` in the bridge."""
        sw = self.topo.switch(h.switch)
        ns_h, ns_s = self.ns(h.name), self.ns(sw.name)
        link = h.link
        if link.impaired:
            self._delay_line(f"delay-{h.name}", sw.name, f"{ns_h}:eth0", f"{ns_s}:{h.name}",
                             link)
        else:
            with N.ipr(ns_s) as ip:
                N.add_veth(ip, h.name, ns_h, "eth0")
        with N.ipr(ns_s) as ip:
            N.link_up(ip, h.name, mtu=link.mtu, master="br0")
            N.shape(ip, h.name, link.rate, link.queue_bytes, link.mtu)
        with N.ipr(ns_h) as ip:
            N.link_up(ip, "eth0", mtu=link.mtu, address=h.address,
                      prefixlen=sw.subnet.prefixlen)
            N.shape(ip, "eth0", link.rate, link.queue_bytes, link.mtu)

    def _delay_line(self, name, node, a, b, link):
        """The userspace delay line between interfaces ``a`` and ``b`` (``netns:ifname``)
        as a lab service in ``node``'s namespace, with ``link``'s delay, jitter and loss."""
        self.start_service(name, node, [
            sys.executable, "-m", "ina_fabric.host.lab.delayline", "--a", a, "--b", b,
            "--delay-ms", str(link.delay_ms), "--jitter-ms", str(link.jitter_ms),
            "--loss", str(link.loss), "--seed", str(len(self.services) + 1),
            "--stats", str(self.state_dir / f"{name}.json")], ready=True)

    def _wan_link(self, w):
        """A routed link between two switches, ends named ``w<peer>``: TAPs joined by the
        delay line when it has delay, jitter or loss, else a veth pair (a fabric's
        uplinks); tbf on both ends."""
        link = w.link
        if link.impaired:
            self._delay_line(f"wan-{w.a}-{w.b}", w.a, f"{self.ns(w.a)}:w{w.b}",
                             f"{self.ns(w.b)}:w{w.a}", link)
        else:
            with N.ipr(self.ns(w.a)) as ip:
                N.add_veth(ip, f"w{w.b}", self.ns(w.b), f"w{w.a}")
        for node, peer, addr in ((w.a, w.b, w.addresses[0]), (w.b, w.a, w.addresses[1])):
            with N.ipr(self.ns(node)) as ip:
                N.link_up(ip, f"w{peer}", mtu=link.mtu, address=addr,
                          prefixlen=w.subnet.prefixlen)
                N.shape(ip, f"w{peer}", link.rate, link.queue_bytes, link.mtu)

    def _routes(self):
        """Switches forward between their bridge and their WAN links along the
        topology's routes; hosts reach the whole lab range through their bridge."""
        from .topology import LAB_NET
        peer = {}
        for w in self.topo.wan:
            peer[(w.a, w.b)] = w.addresses[1]
            peer[(w.b, w.a)] = w.addresses[0]
        for sw in self.topo.switches:
            N.sysctl(self.ns(sw.name), "net/ipv4/ip_forward", "1")
            with N.ipr(self.ns(sw.name)) as ip:
                for dest, via in self.topo.routes.get(sw.name, {}).items():
                    ip.route("add", dst=str(self.topo.switch(dest).subnet),
                             gateway=str(peer[(sw.name, via)]))
        for h in self.topo.hosts:
            with N.ipr(self.ns(h.name)) as ip:
                ip.route("add", dst=str(LAB_NET),
                         gateway=str(self.topo.switch(h.switch).address))

    def _wait_carrier(self, timeout=5.0):
        """Until every bridge port forwards (no STP here, so carrier is enough)."""
        t0 = time.monotonic()
        for sw in self.topo.switches:
            with N.ipr(self.ns(sw.name)) as ip:
                ports = [h.name for h in self.topo.hosts if h.switch == sw.name]
                while True:
                    states = [ip.get_links(ip.link_lookup(ifname=p)[0])[0]
                              .get_attr("IFLA_OPERSTATE") for p in ports]
                    if all(s in ("UP", "UNKNOWN") for s in states):
                        break
                    if time.monotonic() - t0 > timeout:
                        raise LabError(f"links not up after {timeout}s: "
                                       f"{dict(zip(ports, states))}")
                    time.sleep(0.02)

    # -- processes -----------------------------------------------------------------
    def popen(self, node: str, argv, env=None, **kw) -> subprocess.Popen:
        """A process in ``node``'s namespace, with INA_LAB, INA_LAB_NODE and
        INA_SWITCH (the lab switch's ip:port) in its environment."""
        e = dict(os.environ if env is None else env)
        host, port = self.switch_address
        e.setdefault("INA_SWITCH", f"{host}:{port}")
        e["INA_LAB"], e["INA_LAB_NODE"] = self.id, node
        return N.popen(self.ns(node), [str(a) for a in argv], env=e, **kw)

    def run(self, node: str, argv, timeout=None, check=False, **kw):
        """Run ``argv`` in ``node``'s namespace to the end (killed after ``timeout``)."""
        kw.setdefault("text", True)
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        p = self.popen(node, argv, **kw)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.communicate()
            raise
        if check and p.returncode:
            raise LabError(f"{node}: {argv[0]} exited {p.returncode}: {err}")
        return subprocess.CompletedProcess(argv, p.returncode, out, err)

    def start_service(self, name, node, argv, ready=False, env=None):
        """A long-running process (the switch, a delay line), logged to the state dir and
        stopped by ``stop_service`` or ``down``. ``ready``: wait for it to print a line."""
        log = open(self.state_dir / f"{name}.log", "w")
        p = self.popen(node, argv, env=env, stdout=subprocess.PIPE if ready else log,
                       stderr=log)
        log.close()
        if ready:
            line = p.stdout.readline()
            p.stdout.close()
            if line.strip() != b"ready":
                p.wait(5)
                raise LabError(f"{name} did not start: "
                               f"{(self.state_dir / f'{name}.log').read_text()[-500:]}")
        self._procs[name] = p
        self.services[name] = {"pid": p.pid, "node": node, "argv": [str(a) for a in argv]}
        self._save()
        return p

    def stop_service(self, name, timeout=5.0):
        p = self._procs.pop(name, None)
        info = self.services.pop(name, None)
        pid = p.pid if p else (info or {}).get("pid")
        if pid:
            try:
                os.killpg(pid, 15)
                if p:
                    p.wait(timeout)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(pid, 9)
                except ProcessLookupError:
                    pass
        self._save()

    def start_switch(self, node=None, extra=(), engine=None, rtl_params=None):
        """``ina switch`` in the switch namespace, on its bridge address (port 19900);
        waits until it answers a STATUS request. ``engine``: ``--engine`` (board: the
        simulated board on a TAP in the bridge, which takes the bridge's address; it is
        asked from the first host behind it, and may take minutes to build; rtl: the
        gateware in Verilator, whose first build of a core takes minutes too).
        ``rtl_params``: with rtl, ``CoreParams`` fields over ``$INA_RTL_PARAMS`` (the
        tree and leaf options of a fabric's switches)."""
        node = node or self.topo.switches[0].name
        host = self.address(node)
        name = "switch" if node == self.topo.switches[0].name else f"switch-{node}"
        extra = tuple(extra)
        if engine and engine != "auto":
            extra += ("--engine", engine)
        if engine == "board":
            extra += ("--bridge", "br0", "--tap", "board0")
        env = None
        if engine == "rtl" and rtl_params:
            mine = json.loads(os.environ.get("INA_RTL_PARAMS") or "{}")
            env = {**os.environ, "INA_RTL_PARAMS": json.dumps({**mine, **rtl_params})}
        self.start_service(name, node, [sys.executable, "-m", "ina_fabric.host.cli",
                                            "switch", "--listen", f"{host}:{SWITCH_PORT}",
                                            *extra], env=env)
        asker = node
        tries, timeout = 40, 0.5
        if engine == "board":
            asker = next(h.name for h in self.topo.hosts if h.switch == node)
            tries, timeout = 600, 5.0
        elif engine == "rtl":          # a Verilator build of the core: a few minutes
            tries = 600
        probe = [sys.executable, "-c",
                 "import sys; from ina_fabric.protocol.control_client import query_status as q; "
                 f"q(('{host}', {SWITCH_PORT}), timeout={timeout})"]
        for _ in range(tries):
            if self.run(asker, probe, timeout=30).returncode == 0:
                return host, SWITCH_PORT
            p = self._procs.get(name)
            if p is not None and p.poll() is not None:
                break
            time.sleep(0.1)
        raise LabError(f"ina switch did not answer in {node}: "
                       f"{(self.state_dir / f'{name}.log').read_text()[-500:]}")

    def start_fabric(self, tree=True, extra=(), leaf_extra=(), engine=None):
        """A fabric's switches: ``ina switch`` on the spine, then on each top-of-rack
        switch, with ``--parent`` the spine's when ``tree`` (else each stands alone: the
        flat mode puts a single switch at the spine and leaves the racks' idle).
        ``engine``: each one's ``--engine`` (not board); rtl simulates the spine's core
        built with the tree option and each top-of-rack switch's with the tree and leaf
        options (``CoreParams``; ``$INA_RTL_PARAMS`` gives the rest, the same core
        everywhere), a Verilator build per core the first time. Returns [(ip, port)]
        spine first, then the racks in order."""
        if not self.topo.spine:
            raise LabError(f"lab {self.id}: {self.topo.name} is not a fabric (no spine)")
        if engine == "board":
            raise LabError("a fabric's switches run fast, model or rtl, not board (the "
                           "simulated board takes one bridge's address, not a tree)")
        spine = self.start_switch(self.topo.spine, extra=extra, engine=engine,
                                  rtl_params={"tree": True})
        parent = ("--parent", f"{spine[0]}:{spine[1]}") if tree else ()
        leaf = {"tree": True, "leaf": True} if tree else {"tree": True}
        return [spine] + [self.start_switch(t, extra=(*parent, *extra, *leaf_extra),
                                            engine=engine, rtl_params=leaf)
                          for t in self.topo.racks]

    # -- state ---------------------------------------------------------------------
    def _save(self, status=None):
        if status:
            self.status = status
        if not self.state_dir.is_dir():      # down already removed it
            return
        doc = {"id": self.id, "status": self.status, "topology": self.topo.to_dict(),
               "namespaces": {n: self.ns(n) for n in self.topo.nodes},
               "services": self.services, "created": time.time()}
        (self.state_dir / "state.json").write_text(json.dumps(doc, indent=2))

    @classmethod
    def attach(cls, lab_id="0") -> "Lab":
        """The lab ``lab_id`` that ``ina lab up`` built (from its state file)."""
        st = load_state(lab_id)
        if not st or st.get("status") != "up":
            raise LabError(f"no lab {lab_id} is up (`ina lab up TOPOLOGY --id {lab_id}`)")
        lab = cls(_topology_from_state(st["topology"]), lab_id)
        lab.services = st.get("services", {})
        lab.status = "up"
        return lab

    def down(self):
        for p in self._procs.values():          # all at once, then wait for each
            try:
                os.killpg(p.pid, 15)
            except ProcessLookupError:
                pass
        for name in list(self._procs):
            self.stop_service(name)
        return down(self.id)

    def __enter__(self):
        return self.up()

    def __exit__(self, *exc):
        self.down()


def _topology_from_state(t) -> Topology:
    """The Topology a state file recorded (hosts with their exact addresses)."""
    import ipaddress
    from .topology import HostSpec, LinkSpec, SwitchSpec, WanLinkSpec
    topo = Topology(name=t["name"], params=t.get("params", {}))
    topo.switches = [SwitchSpec(s["name"], ipaddress.ip_network(s["subnet"]))
                     for s in t["switches"]]
    topo.hosts = [HostSpec(h["name"], h["switch"], ipaddress.ip_address(h["address"]),
                           LinkSpec(h["rate"], h["delay_ms"], h["jitter_ms"], h["loss"],
                                    h["mtu"], h["queue_ms"])) for h in t["hosts"]]
    topo.wan = [WanLinkSpec(w["a"], w["b"], ipaddress.ip_network(w["subnet"]),
                            LinkSpec(w["rate"], w["delay_ms"], w["jitter_ms"], w["loss"],
                                     w["mtu"], w["queue_ms"])) for w in t.get("wan", [])]
    topo.routes, topo.labels = t.get("routes", {}), t.get("labels", {})
    topo.racks, topo.spine = t.get("racks", []), t.get("spine")
    topo.oversubscription = t.get("oversubscription")
    return topo


def training_lab(topology: str, hosts: int, sets: dict | None = None, lab_id="train",
                 pace_switch=False):
    """A lab for training and benches (``ina train --lab``, ``ina bench train --lab``):
    ``hosts`` hosts and jumbo frames unless ``sets`` says otherwise (a fabric: racks of
    ``hosts_per_rack``, default 4, its switches a tree where the checkout has one, the
    spine's address returned), ``ina switch`` started in it (``pace_switch``: its RESULTs
    to a host no faster than the slowest host link, ``ina switch --pace-rate``). Returns ``(lab, "ip:port" of the switch, elements per
    packet)``, the elements being the most (a power of two) that fit the lab's MTU. The
    caller calls ``down()``."""
    from .topology import load
    sets = dict(sets or {})
    extra = ("--pace-rate", "{rate}") if pace_switch else ()
    if load(topology).spine:
        topo = load(topology, {"mtu": 9000, **sets, **_fabric_shape(topology, hosts, sets)})
    else:
        topo = load(topology, {"hosts": hosts, "mtu": 9000, **sets})
    lab = Lab(topo, lab_id).up()
    extra = tuple(a.format(rate=min(h.link.rate for h in topo.hosts)) for a in extra)
    try:
        if topo.spine:
            host, port = lab.start_fabric(tree=True, extra=extra)[0]
        else:
            host, port = lab.start_switch(extra=extra)
    except BaseException:
        lab.down()
        raise
    mtu = min(h.link.mtu for h in topo.hosts)
    elements = 1 << (((mtu - 48) // 4).bit_length() - 1)
    return lab, f"{host}:{port}", elements


def _params(topology) -> dict:
    from .topology import load
    return load(topology).params


def _fabric_shape(topology, hosts, sets) -> dict:
    """A fabric for ``hosts`` training hosts: racks of ``hosts_per_rack`` (set, or the
    topology's default when the hosts fill them, else one rack of them all)."""
    per = int(sets.get("hosts_per_rack", 0)) or int(_params(topology)["hosts_per_rack"])
    if "hosts_per_rack" not in sets and hosts % per:
        per = hosts
    racks = int(sets.get("racks", 0)) or max(1, hosts // per)
    if racks * per != hosts:
        raise LabError(f"{hosts} hosts do not fill {racks} racks of {per}: set racks and "
                       f"hosts_per_rack (--lab-set) so that racks x hosts_per_rack = {hosts}")
    return {"racks": racks, "hosts_per_rack": per}
