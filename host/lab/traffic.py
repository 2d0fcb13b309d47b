"""Background traffic that shares chosen links, so queueing delay and tails come from
real queues (for every protocol alike), not from per-datagram random draws.

A :class:`Flow` is one on/off source and its sink, each a bounded lab service that stops
by itself after ``seconds`` (and ``down`` stops it in any case):

- ``tcp``: one bulk TCP connection, sending as fast as the links take it while on;
- ``udp``: datagrams paced at ``rate`` while on (the load; duty cycle on/(on+off)).

    flows = [Flow("udp", "h2", "h0", seconds=30, rate="80mbit", on_ms=50, off_ms=50)]
    start(lab, flows)        # h2 -> h0 crosses h2's uplink and h0's downlink
"""

from dataclasses import dataclass
import sys

__all__ = ["Flow", "start", "MAX_SECONDS"]

MAX_SECONDS = 3600.0
BASE_PORT = 5100


@dataclass(frozen=True)
class Flow:
    kind: str                 # "tcp" or "udp"
    src: str
    dst: str
    seconds: float = 10.0
    on_ms: float = 100.0
    off_ms: float = 0.0       # 0: always on
    rate: str = "10mbit"      # udp: the sending rate while on
    size: int = 1200          # udp: datagram bytes

    def __post_init__(self):
        if self.kind not in ("tcp", "udp"):
            raise ValueError(f"flow kind {self.kind!r}: tcp or udp")
        if not 0 < self.seconds <= MAX_SECONDS:
            raise ValueError(f"flow seconds {self.seconds}: in (0, {MAX_SECONDS:g}]")
        if self.on_ms <= 0 or self.off_ms < 0:
            raise ValueError("on_ms > 0 and off_ms >= 0")


def start(lab, flows) -> list[str]:
    """Start every flow (sink first, then source) as lab services; their names."""
    names = []
    k = sum(1 for n in lab.services if n.startswith("bg") and n.endswith("-sink"))
    for f in flows:
        port = BASE_PORT + k
        py = [sys.executable, "-m", "ina_fabric.host.lab.probe"]
        lab.start_service(f"bg{k}-sink", f.dst, py + ["sink", "--port", port, "--seconds",
                                                      f.seconds + 5], ready=True)
        argv = py + [f"bg-{f.kind}", "--to", f"{lab.address(f.dst)}:{port}", "--seconds",
                     f.seconds, "--on-ms", f.on_ms, "--off-ms", f.off_ms]
        if f.kind == "udp":
            argv += ["--rate", f.rate, "--size", f.size]
        lab.start_service(f"bg{k}-{f.kind}", f.src, argv)
        names += [f"bg{k}-sink", f"bg{k}-{f.kind}"]
        k += 1
    return names
