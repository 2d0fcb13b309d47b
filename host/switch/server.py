"""``ina switch``: the software switch over UDP (the default when no FPGA is there).

One thread, one socket, two engines with the same semantics:

* ``fast`` (the default): ``FastSwitchModel``; its compiled loop (``_engine.c``) waits
  for a datagram or the next deadline, receives a batch (``recvmmsg``), handles DATA,
  sends the results (``sendmmsg``) and fires deadlines on time; the few datagrams that
  are not DATA (CONTROL, STATUS_REQ, garbage) come back here for the model's Python code.
* ``model``: the reference ``SwitchModel`` itself, one datagram at a time (also what an
  impaired switch runs, since impairment wraps the Python socket).
* ``rtl``: ``RtlSwitchModel`` (``rtl.py``): the gateware (``hw/ina``) in Verilator, the
  model beside it as a live scoreboard; the datagrams waiting in the socket go into the
  core back to back, and the first disagreement stops the server (``RtlDisagreement``).

(``ina switch --engine board`` is not served from here: ``board.BoardSwitch`` runs the
whole board's datapath on a TAP, with no socket and no Python on the datapath.)

SIGINT (unless the process was started with it ignored) and SIGTERM stop it cleanly and
print the counters. A malformed datagram is a counted drop, never a crash.

Multicast RESULTs (a job with a group) leave by the interface of the listen address;
listening on 0.0.0.0 they stay on loopback (never out of a default route).
"""

import socket
import time

from .keys import switch_key
from .model import SwitchModel
from . import fast
from ..transport.sockbuf import size_buffers

_DEFAULT = object()

__all__ = ["SwitchServer"]


class SwitchServer:
    """``key``: the control key (default: ``keys.switch_key(create=True)``, the machine's
    key file, made on first use); ``key=None`` takes no CONTROL or STATUS_REQ at all."""

    def __init__(self, jobs, host="0.0.0.0", port=19900, impairment=None, log=None,
                 key=_DEFAULT, engine="auto", pace_rate=0.0, parent=None, pool_slots=None,
                 gso=False):
        """``engine``: "fast", "model", "rtl", or "auto" (fast where it is built and no
        impairment is asked for, else the model, saying why through ``log``).
        ``pace_rate``: bit/s, RESULTs to any one worker no faster than this (its
        downlink's rate; the fast engine only); 0: as fast as they are formed.
        ``parent``: this switch's parent in a tree of switches, ``(ip, port)``
        (docs/fabric.md): a tree entry that names another parent is refused.
        ``pool_slots``: the shared slot pool (docs/pool.md; needs ``parent``, which takes
        its overflow; fast and model engines).
        ``gso``: the fast engine sends a run of RESULTs to one destination as one UDP GSO
        send (``Engine.set_gso``; docs/congestion.md, "Sending in runs"). Off by
        default: on the WAN lab the runs made a round's time overrun its prediction."""
        if key is _DEFAULT:
            key = switch_key(create=True)
        impaired = impairment is not None and impairment.active
        if engine == "board":
            raise ValueError("the board engine serves a TAP, not a UDP socket: "
                             "host.switch.board.BoardSwitch (ina switch --engine board)")
        if engine not in ("auto", "fast", "model", "rtl"):
            raise ValueError(f"engine {engine!r}: expected auto, fast, model or rtl")
        if engine in ("fast", "rtl") and impaired:
            raise ValueError("an impaired switch runs the model engine (impairment wraps "
                             "the Python socket); use engine='model' or 'auto'")
        if engine == "auto":
            engine = "model" if impaired or not fast.available() else "fast"
            if not fast.available() and log:
                log(f"ina switch: serving with the Python model: {fast.WHY_NOT}")
        self.engine = engine
        if pace_rate and engine != "fast":
            raise ValueError(f"pacing RESULTs (pace_rate) needs the fast engine, not "
                             f"{engine!r}")
        if pool_slots is not None and engine == "rtl":
            raise ValueError("the rtl engine has no slot pool yet (docs/pool.md)")
        if engine == "rtl":
            from .rtl import RtlSwitchModel
            self.model = RtlSwitchModel(jobs, key=key, log=log)
        else:
            self.model = (fast.FastSwitchModel if engine == "fast" else SwitchModel)(
                jobs, key=key, parent=parent, pool_slots=pool_slots)
        if pace_rate:
            self.model.engine.set_pace(float(pace_rate))
        if engine == "fast":
            self.model.engine.set_gso(bool(gso))
        #: why the server stopped by itself (an RTL scoreboard disagreement), or None
        self.failure = None
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        # No SO_REUSEADDR: the port is this switch's alone (with it, a second switch or
        # any local process could bind the same port and take the traffic).
        size_buffers(self.sock, 16 << 20, 16 << 20)   # past net.core.rmem_max if root
        self.sock.bind((host, port))
        self.address = self.sock.getsockname()
        mif = "127.0.0.1" if host in ("0.0.0.0", "") else socket.gethostbyname(host)
        self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(mif))
        self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
        self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
        self.out = self.sock
        if impairment is not None and impairment.active:
            from ..transport.impair import ImpairedSocket
            self.out = ImpairedSocket(self.sock, impairment)
        self.running = False
        self.errors = 0
        self.log = log

    def serve_forever(self, install_signals=True):
        if install_signals:
            from ..oneline import stop_on_signals
            stop_on_signals(self.stop)
        self.running = True
        if self.engine == "fast":
            return self._serve_fast()
        if self.engine == "rtl":
            return self._serve_rtl()
        model, sock, out = self.model, self.sock, self.out
        buf = bytearray(65536)
        clock = time.monotonic
        while self.running:
            nd = model.next_deadline()
            wait = 0.2 if nd is None else min(nd - clock(), 0.2)
            if wait <= 0:
                # a deadline fell due (perhaps while the last datagram was processed):
                # fire it now. settimeout(0) would make the socket non-blocking instead,
                # and its BlockingIOError used to skip tick and spin.
                for dest, data in model.tick(clock()):
                    self._send(out, data, dest)
                continue
            sock.settimeout(wait)
            try:
                n, src = sock.recvfrom_into(buf)
            except (socket.timeout, BlockingIOError):
                for dest, data in model.tick(clock()):
                    self._send(out, data, dest)
                continue
            except OSError:
                if not self.running:
                    break
                self.errors += 1
                continue
            try:
                replies = model.process(bytes(buf[:n]), src, clock())
            except Exception as e:  # a bug in the model must not take the service down
                self.errors += 1
                if self.log:
                    self.log(f"internal error on a datagram from {src}: {e!r}")
                continue
            for dest, data in replies:
                self._send(out, data, dest)

    def _serve_fast(self):
        model, sock, serve, fd = self.model, self.sock, self.model.engine.serve, \
            self.sock.fileno()
        clock = time.monotonic
        while self.running:
            try:
                others = serve(fd, 0.2)
            except OSError:
                if not self.running:
                    break
                self.errors += 1
                continue
            for data, ip, port in others:
                src = (fast.ip_str(ip), port)
                try:
                    replies = model.process(data, src, clock())
                except Exception as e:  # a bug in the model must not take it down
                    self.errors += 1
                    if self.log:
                        self.log(f"internal error on a datagram from {src}: {e!r}")
                    continue
                for dest, reply in replies:
                    self._send(sock, reply, dest)

    def _serve_rtl(self, batch=256):
        """The datagrams waiting in the socket (up to ``batch``) go into the core back to
        back; a disagreement with the scoreboard stops the server (``failure``)."""
        from .rtl import RtlDisagreement
        model, sock = self.model, self.sock
        clock = time.monotonic
        bufs = [bytearray(65536) for _ in range(batch)]
        while self.running:
            nd = model.next_deadline()
            wait = 0.2 if nd is None else max(0.0, min(nd - clock(), 0.2))
            items = []
            sock.settimeout(wait if wait > 0 else 0.0)
            try:
                while len(items) < batch:
                    n, src = sock.recvfrom_into(bufs[len(items)])
                    items.append((bytes(bufs[len(items)][:n]), src))
                    sock.settimeout(0.0)
            except (socket.timeout, BlockingIOError):
                pass
            except OSError:
                if not self.running:
                    break
                self.errors += 1
            try:
                replies = model.process_batch(items, clock()) if items else \
                    model.tick(clock())
            except Exception as e:   # the core and the model may no longer be in step
                self.failure = str(e) if isinstance(e, RtlDisagreement) else \
                    f"ina switch (rtl): internal error: {e!r}"
                if self.log:
                    self.log(self.failure)
                self.running = False
                break
            for dest, data in replies:
                self._send(sock, data, dest)

    def _send(self, out, data, dest):
        try:
            out.sendto(data, dest)
        except OSError:
            self.errors += 1

    def stop(self):
        self.running = False

    def close(self):
        self.out.close() if self.out is not self.sock else self.sock.close()
        if hasattr(self.model, "close"):
            self.model.close()
