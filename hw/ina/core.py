"""The INA core: aggregator + replicator behind two packet streams and a register bus.

Instantiate::

    from ina_fabric.hw.ina.core import InaCore
    from ina_fabric.hw.ina.params import CoreParams
    core = InaCore(CoreParams(workers=32, window=8, elements=64, lanes=1, jobs=2))
    # core.i   : In(stream.Signature(in_layout(L)))   INA datagrams (UDP payloads) from workers
    # core.o   : Out(stream.Signature(out_layout(L))) RESULT datagrams, one per destination
    # core.cfg : In(RegBus)                            job table, member table, counters
    # core.now : Out(32)                               the cycle counter (time of deadlines)

Stream payload (hw/ina/layout.py). Each beat carries ``L`` big-endian 32-bit words of the
UDP payload in ``data`` (lane 0 first on the wire) and ``n``, the number of valid words in
the beat. ``first``/``last`` mark the datagram's first and last beat. The 5 header words
fill the first ``ceil(5/L)`` beats and the elements begin on a new beat (header beats
after word 4 are padding: ``n`` tells how many words are real). Input beats also carry
``length`` (UDP payload bytes), ``src_ip`` and ``src_port``, read on ``first``; the input
must carry exactly ``ceil(length/4)`` words. Output beats carry the destination
(``dst_mac``, ``dst_ip``, ``dst_port``), ``length`` and the IPv4 header ``ip_checksum``
of the RESULT copy, constant over the datagram, for the L2/L3 deparser in front.

The core accepts one beat per cycle with no bubbles. ``i.ready`` falls only while a job
is being (re)initialized or while its 16-beat input FIFO is full; the FIFO stops
draining while the output queue is nearly full, or while a packet that would reuse a
slot whose previous result is still queued or being sent waits to run again.
"""

from amaranth.hdl import *
from amaranth.lib import wiring, stream, memory, data
from amaranth.lib.wiring import In, Out

from .params import CoreParams
from .layout import in_layout, out_layout
from .regs import RegBus

__all__ = ["InaCore"]


class InaCore(wiring.Component):
    """Aggregator + replicator. See the module docstring for ports and payloads."""

    def __init__(self, params: CoreParams = CoreParams(), *, planted_bug: str | None = None):
        self.params = params
        #: for tests that show a planted bug is caught: None, "wrapping_adder",
        #: "no_duplicate_check"
        self.planted_bug = planted_bug
        super().__init__({
            "i": In(stream.Signature(in_layout(params.lanes))),
            "o": Out(stream.Signature(out_layout(params.lanes))),
            "cfg": In(RegBus),
            "now": Out(32),
        })

    def elaborate(self, platform):
        from .aggregator import build_core
        return build_core(self, platform)
