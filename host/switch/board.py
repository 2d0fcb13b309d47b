"""``ina switch --engine board``: the Versa board's datapath in Verilator, on a TAP.

The whole design behind the board's RGMII pads (``hw/boards/datapath.py``: both ports'
MAC, ARP/IPv4/UDP/ICMP, the in-band control plane with the HMAC key, the INA core, the
replicator; ``hw/verilator/board.py``) runs in Verilator with its clocks at the board's
ratios, and port 0 (the workers' port) is bridged to a TAP device (``IFF_TAP |
IFF_NO_PI``): every frame the kernel sends into the TAP goes into the board's GMII
receive, and every frame the board transmits comes out of the TAP as it left the MAC
(preamble and FCS checked and removed, as a NIC does). There is no UDP socket and no
Python on the datapath: the kernel's own ARP, ping and UDP talk to the gateware, and a
job is installed by a CONTROL sealed with the key the board was built with (the
switch's key, ``keys.switch_key``), which the gateware checks.

The TAP is made in the serving process's namespace, or in ``netns`` (the process
enters it first; ``ina lab up rack --switch board`` runs the switch in the switch
namespace and attaches the TAP to the bridge, taking the bridge's address away so that
the board, not the kernel, answers for it). ``tap_address`` (CIDR) gives the TAP's own,
kernel side, an address in the board's subnet, so that processes in that namespace reach
the board through it.

Time: the board's clock runs while a frame is queued or on the wire and for
``idle_tail_us`` simulated microseconds after the last byte either way (what the
control plane needs to answer), longer while a bounded job is enabled (its deadline
and the scanner's round: ``BoardSwitch.tail``, so a slot left open is closed by the
board's own deadline); after that the clock stops until the next frame. Simulated time is far slower than real time
(``stats()`` has the ratio).
"""

import ipaddress
import os
import time

from ina_fabric.protocol.fields import INA_UDP_PORT

__all__ = ["BoardSwitch", "BoardNet", "board_params", "why_not", "DEFAULT_TAP", "BOARD_IP", "TAP_ADDRESS"]

DEFAULT_TAP = "inaboard0"
#: the addresses ``BoardNet`` gives a board of its own (lab addresses, 198.18.0.0/15)
BOARD_IP = "198.18.41.2"
TAP_ADDRESS = "198.18.41.1/24"


def board_params():
    """The Versa's core (``CoreParams`` from constraints/versa_ecp5.toml [core]), with the
    answer path on: the simulated board answers refused DATA as a core built with it
    does (the Versa bitstream leaves it off until its core clock affords it; the toml
    says why), so that a client against the board engine hears its mistake at once."""
    import dataclasses
    import tomllib
    from ina_fabric.paths import resource
    from ina_fabric.hw.ina.params import CoreParams
    with resource("ina_fabric.constraints", "versa_ecp5.toml").open("rb") as fh:
        return dataclasses.replace(CoreParams(**tomllib.load(fh).get("core", {})),
                                   answers=True)


def why_not() -> str | None:
    """Why the board engine cannot run here, or None."""
    from .rtl import why_not as rtl_why
    why = rtl_why()
    if why:
        return why
    if not os.path.exists("/dev/net/tun"):
        return "no /dev/net/tun (TUN/TAP)"
    if os.geteuid() != 0:
        return "needs root (a TAP device and its address)"
    try:
        import pyroute2  # noqa: F401
    except ImportError:
        return "needs pyroute2 (pip install 'ina-fabric[lab]')"
    return None


class BoardSwitch:
    """The simulated board on a TAP. ``host``: the board's IP (its port is the INA
    port); ``worker_net``: the subnet behind port 0 (default: ``tap_address``'s network,
    else the /24 around ``host``)."""

    engine = "board"

    def __init__(self, host, port=INA_UDP_PORT, *, key, tap=DEFAULT_TAP, tap_address=None,
                 netns=None, bridge=None, worker_net=None, idle_tail_us=250.0, log=None):
        why = why_not()
        if why:
            raise RuntimeError(why)
        if port != INA_UDP_PORT:
            raise ValueError(f"the board serves UDP port {INA_UDP_PORT} only (its ingress "
                             f"matches that port), not {port}")
        try:
            ip = ipaddress.IPv4Address(host)
        except ValueError:
            raise ValueError(f"the board needs its own IPv4 address, not {host!r}") from None
        if ip.is_unspecified or ip.is_loopback:
            raise ValueError(f"the board needs its own IPv4 address on the TAP's subnet, not "
                             f"{host} (--listen 198.18.x.y:{INA_UDP_PORT})")
        if key is None:
            raise ValueError("the board is built with a control key (CONTROL is its only "
                             "way to take a job)")
        if worker_net is None:
            worker_net = str(ipaddress.IPv4Interface(tap_address).network) if tap_address \
                else str(ipaddress.IPv4Network(f"{host}/24", strict=False))
        if idle_tail_us <= 0:
            raise ValueError(f"idle_tail_us {idle_tail_us}: must be > 0")
        from ina_fabric.hw.verilator.board import BoardSim, versa_board, SYNC_HZ
        self.log = log
        self.address = (str(ip), port)
        self.idle_tail = int(idle_tail_us * 1e-6 * SYNC_HZ)
        self.sync_hz = SYNC_HZ
        self.params = board_params()
        self.sim = BoardSim(versa_board(ip=str(ip), worker_net=worker_net, key=key), log=log)
        self.tap = tap
        if netns:
            from ..lab.netns import enter
            enter(netns)
        from ..lab.delayline import open_tap
        self.fd = open_tap(tap)
        try:
            self._configure(tap_address, bridge)
        except BaseException:
            os.close(self.fd)
            raise
        self.running = False
        self.failure = None
        self.errors = 0
        self.wall_start = time.monotonic()

    def _configure(self, tap_address, bridge):
        from pyroute2 import IPRoute
        from ..lab.netns import link_up
        with IPRoute() as ip:
            if bridge:
                # the board takes the bridge's address: the kernel must not answer for it
                bidx = ip.link_lookup(ifname=bridge)
                if not bidx:
                    raise ValueError(f"no bridge {bridge!r} here")
                for a in ip.get_addr(index=bidx[0], family=2):
                    if a.get_attr("IFA_ADDRESS") == self.address[0]:
                        ip.addr("del", index=bidx[0], address=self.address[0],
                                prefixlen=a["prefixlen"])
            # no IPv6 on the TAP: the board has none, and the kernel's router
            # solicitations and MLD reports would only cost simulated cycles
            try:
                with open(f"/proc/sys/net/ipv6/conf/{self.tap}/disable_ipv6", "w") as f:
                    f.write("1")
            except OSError:
                pass
            iface = ipaddress.IPv4Interface(tap_address) if tap_address else None
            link_up(ip, self.tap, master=bridge,
                    address=str(iface.ip) if iface else None,
                    prefixlen=iface.network.prefixlen if iface else None)

    # -- serving ---------------------------------------------------------------------
    def serve_forever(self, install_signals=True):
        if install_signals:
            from ..oneline import stop_on_signals
            stop_on_signals(self.stop)
        self.running = True
        tail, seen = self.idle_tail, None
        while self.running:
            # (C++ with the GIL released: the TAP read, the clocks, the TAP write)
            cycles = self.sim.serve([self.fd, -1], 0.2, tail)
            if cycles != seen:          # (the table is read only after the clock ran)
                tail = self.tail()
                seen = self.sim.stats()["sync_cycles"]

    #: the longest idle tail a job's deadline may ask for (simulated seconds)
    MAX_TAIL_S = 0.5

    def tail(self) -> int:
        """Sync cycles the clock runs on after the last byte: ``idle_tail``, or, while a
        bounded job is enabled, its deadline plus the scanner's round. The deadline is
        simulated time; were the clock stopped once the wire went quiet, a slot a late
        or lost DATA left open would never reach it (the host waits in wall time, the
        board's time stands still) and the board would send no PARTIAL until the next
        frame. Each register is read twice (a read while the control plane writes the
        table shows garbage): a value counts only when both reads agree."""
        from ina_fabric.hw.verilator.board import CORE_HZ
        from ina_fabric.protocol.regs import job_reg_addr
        P = self.params
        def reg(j, name):
            a = job_reg_addr(j, name)
            v = self.sim.read_core(a)
            return v if self.sim.read_core(a) == v else None
        longest = 0
        for j in range(P.jobs):
            if reg(j, "enable") == 1 and reg(j, "bounded") == 1:
                longest = max(longest, reg(j, "deadline") or 0)
        if not longest:
            return self.idle_tail
        # the scanner visits one record a cycle; a slot is closed within two rounds
        core = longest + 4 * P.records + 64
        return min(max(self.idle_tail, int(core * self.sync_hz / CORE_HZ) + 1),
                   int(self.MAX_TAIL_S * self.sync_hz))

    def stop(self):
        self.running = False

    def close(self):
        if self.fd is not None:
            os.close(self.fd)          # a non-persistent TAP: the device goes with it
            self.fd = None
        self.sim.close()

    # -- figures ---------------------------------------------------------------------
    def stats(self) -> dict:
        """The harness's counts, the board's port counters and its clocks: simulated
        seconds, wall seconds spent simulating, and their ratio."""
        s = self.sim.stats()
        sim_s = s["sync_cycles"] / self.sync_hz
        busy = s["sim_ns"] / 1e9
        return {**s, "simulated_s": sim_s, "simulating_wall_s": busy,
                "sim_time_ratio": sim_s / busy if busy else None,
                "wall_s": time.monotonic() - self.wall_start,
                "port0": {k: v for k, v in self.sim.port_counters(0).items() if v},
                "port1": {k: v for k, v in self.sim.port_counters(1).items() if v}}


def _board_child(conn, netns, key, idle_tail_us):
    """The forked board process of ``BoardNet``: the board on a TAP in ``netns`` until
    SIGTERM; then its figures (and the core's counters) to ``conn``."""
    import sys
    try:
        server = BoardSwitch(BOARD_IP, key=key, tap=DEFAULT_TAP, tap_address=TAP_ADDRESS,
                             netns=netns, idle_tail_us=idle_tail_us,
                             log=lambda m: print(m, file=sys.stderr, flush=True))
    except BaseException as e:
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready", server.address))
    try:
        server.serve_forever()
    finally:
        st = server.stats()
        st["core"] = {k: v for k, v in server.sim.core_counters().items() if v}
        server.close()
        conn.send(("stats", st))


class BoardNet:
    """A network namespace of its own (``inaboard-<pid>``, loopback up) with the board
    on a TAP in it at ``BOARD_IP`` (the kernel side ``TAP_ADDRESS``): what ``ina train
    --engine board``, the bench and the test run the workers against. Processes that
    talk to the board enter the namespace (``enter()``, after fork). ``close()`` stops
    the board (its figures: ``stats``) and removes the namespace.

        with BoardNet(key) as net:      # builds the board on first use (minutes)
            ...fork workers that call net.enter() and use net.switch...
        net.stats                       # the board's figures at exit
    """

    def __init__(self, key, *, idle_tail_us=250.0, start_timeout=1800.0, name=None):
        import multiprocessing as mp
        from ..lab import netns as ns
        why = why_not() or ns.available()
        if why:
            raise RuntimeError(why)
        self.netns = name or f"inaboard-{os.getpid()}"
        self.switch = (BOARD_IP, INA_UDP_PORT)
        self.stats = None
        self.proc = None
        ns.create_namespace(self.netns)
        try:
            with ns.ipr(self.netns) as ip:
                ns.link_up(ip, "lo")
            ctx = mp.get_context("fork")
            self._conn, child = ctx.Pipe()
            self.proc = ctx.Process(target=_board_child,
                                    args=(child, self.netns, key, idle_tail_us), daemon=True)
            self.proc.start()
            if not self._conn.poll(start_timeout):
                raise RuntimeError(f"the board did not come up within {start_timeout:.0f} s")
            kind, val = self._conn.recv()
            if kind != "ready":
                raise RuntimeError(f"the board did not start: {val}")
        except BaseException:
            self.close()
            raise

    def enter(self):
        """Move the calling process (one thread: after fork) into the board's namespace."""
        from ..lab.netns import enter
        enter(self.netns)

    def close(self):
        from ..lab import netns as ns
        if self.proc is not None:
            if self.proc.is_alive():
                self.proc.terminate()
                if self._conn.poll(30):
                    try:
                        kind, val = self._conn.recv()
                        if kind == "stats":
                            self.stats = val
                    except EOFError:
                        pass
            self.proc.join(timeout=10)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join()
            self.proc = None
        ns.kill_in([self.netns])
        ns.remove_namespace(self.netns)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
