"""Userspace impairment layer (this kernel has no netem): loss, duplication, reordering and
delay drawn from a chosen distribution, seeded and reproducible.

``Impairment`` is the policy: it decides, for each datagram, whether to drop it, how many
copies to send and how long each copy is held. ``ImpairedSocket`` is the mechanism: it
wraps a UDP socket's ``sendto`` and releases held copies from a timer thread. The same
policy object can sit on the worker side (uplink) or in the switch (downlink).

Delay model: lognormal with the given median and P99/P50 ratio
(sigma = ln(ratio) / z_0.99), so ``p99_over_p50=3.0`` reproduces OptiReduce's heavy-tail
setting; ratio 1.0 is a constant delay.
"""

from dataclasses import dataclass, field
import heapq
import math
import threading
import time

import numpy as np

from ina_fabric.protocol.fields import HEADER_BYTES

__all__ = ["Impairment", "ImpairedSocket", "Z99"]

Z99 = 2.3263478740408408  # standard normal quantile at 0.99


@dataclass
class Impairment:
    loss: float = 0.0            # probability a datagram is dropped
    duplicate: float = 0.0       # probability a datagram is sent twice
    reorder: float = 0.0         # probability a datagram is held back by reorder_delay
    reorder_delay: float = 0.0005
    delay_median: float = 0.0    # seconds
    p99_over_p50: float = 1.0
    seed: int = 0
    log_drops: bool = False      # keep the headers of dropped datagrams in ``dropped``
    counts: dict = field(default_factory=lambda: {"seen": 0, "dropped": 0,
                                                  "duplicated": 0, "reordered": 0})

    def __post_init__(self):
        for name in ("loss", "duplicate", "reorder"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"impairment {name}={p}: must be a probability in [0, 1]")
        if self.delay_median < 0 or self.reorder_delay < 0:
            raise ValueError("impairment delays must be >= 0")
        if self.p99_over_p50 < 1.0:
            raise ValueError(f"p99_over_p50={self.p99_over_p50}: must be >= 1")
        self.rng = np.random.default_rng(self.seed)
        self.dropped = []

    def fresh(self, **changes) -> "Impairment":
        """A new policy with the same settings (and ``changes``, e.g. a per-sender
        ``seed``): its own generator and zeroed counts. The one way a configured
        impairment is handed to each sender."""
        from dataclasses import fields
        kw = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "counts"}
        kw.update(changes)
        return Impairment(**kw)

    @property
    def active(self) -> bool:
        return bool(self.loss or self.duplicate or self.reorder or self.delay_median)

    @property
    def sigma(self) -> float:
        return math.log(self.p99_over_p50) / Z99

    def delays(self, n: int) -> np.ndarray:
        """n one-way delays (seconds) from the configured distribution."""
        if self.delay_median == 0:
            return np.zeros(n)
        if self.sigma == 0:
            return np.full(n, self.delay_median)
        return self.delay_median * np.exp(self.sigma * self.rng.standard_normal(n))

    def decide(self, n: int = 1):
        """For n datagrams: copies (0, 1 or 2) and the hold time of each copy."""
        r = self.rng.random((3, n))
        copies = np.where(r[0] < self.loss, 0, np.where(r[1] < self.duplicate, 2, 1))
        hold = self.delays(2 * n).reshape(2, n)
        hold[0] += np.where(r[2] < self.reorder, self.reorder_delay, 0.0)
        c = self.counts
        c["seen"] += n
        c["dropped"] += int((copies == 0).sum())
        c["duplicated"] += int((copies == 2).sum())
        c["reordered"] += int(((r[2] < self.reorder) & (copies > 0)).sum())
        return copies, hold


class ImpairedSocket:
    """A UDP socket whose ``sendto`` goes through an :class:`Impairment`.

    Everything else (``recvfrom``, ``recv_into``, ``settimeout``, ...) is the socket's.
    Held datagrams are released by one timer thread in deadline order.
    """

    def __init__(self, sock, impairment: Impairment):
        self._sock = sock
        self.impairment = impairment
        self._heap = []
        self._cv = threading.Condition()
        self._seq = 0
        self._closed = False
        self._thread = None
        if impairment.delay_median or impairment.reorder:
            self._thread = threading.Thread(target=self._pump, daemon=True)
            self._thread.start()

    def __getattr__(self, name):
        return getattr(self._sock, name)

    def sendto(self, data, addr):
        imp = self.impairment
        copies, hold = imp.decide(1)
        if imp.log_drops and copies[0] == 0:
            imp.dropped.append(bytes(data[:HEADER_BYTES]))
        for k in range(int(copies[0])):
            delay = float(hold[k, 0])
            if delay <= 0 or self._thread is None:
                self._sock.sendto(data, addr)
            else:
                with self._cv:
                    self._seq += 1
                    heapq.heappush(self._heap, (time.monotonic() + delay, self._seq,
                                                bytes(data), addr))
                    self._cv.notify()
        return len(data)

    def _pump(self):
        while True:
            with self._cv:
                while not self._closed and (
                        not self._heap or self._heap[0][0] > time.monotonic()):
                    timeout = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cv.wait(timeout)
                if self._closed:
                    return
                _, _, data, addr = heapq.heappop(self._heap)
            try:
                self._sock.sendto(data, addr)
            except OSError:
                pass  # socket closed under us at shutdown

    def close(self):
        with self._cv:
            self._closed = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout=1)
        self._sock.close()
