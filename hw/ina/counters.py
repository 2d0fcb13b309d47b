"""The core's event counters (the reference model's counter names, plus stream_errors)."""

from amaranth.hdl import *
from amaranth.lib import wiring, data
from amaranth.lib.wiring import In, Out

from .regs import COUNTER_NAMES

__all__ = ["COUNTER_EVENTS", "Counters"]

#: how many events each counter can take in one cycle (one input bit each): the blocks
#: that raise them are named in :class:`Counters`
COUNTER_EVENTS = {
    "rx": 1, "rx_data": 1, "accepted": 1, "duplicates": 2, "late": 1, "results": 2,
    "partials": 2, "overflows": 1, "resent": 1, "status_requests": 1, "drop_truncated": 1,
    "drop_malformed": 5, "drop_bad_version": 1, "drop_unknown_job": 1,
    "drop_unknown_source": 1, "drop_bad_session": 1, "drop_stale": 1, "drop_out_of_window": 1,
    "stream_errors": 2, "status_unpadded": 1, "control": 1, "control_refused": 1,
    "drop_unauthenticated": 1, "drop_control_busy": 1, "errors_sent": 1, "errors_limited": 1,
}
assert tuple(COUNTER_EVENTS) == COUNTER_NAMES


class Counters(wiring.Component):
    """One 32-bit counter per name in :data:`COUNTER_NAMES`.

    inc      per counter, one bit per event that happened this cycle (the header
             pipeline raises most; ``overflows`` comes from the replicator,
             ``stream_errors`` from the element path, the STATUS_REQ and CONTROL
             counters from the control plane)
    values   the counters, in :data:`COUNTER_NAMES` order (for the register file)

    The events of a cycle are summed into a registered step first, so a counter lags
    its events by one cycle and its adder starts from flip-flops.
    """

    inc: In(data.StructLayout(COUNTER_EVENTS))
    values: Out(data.ArrayLayout(32, len(COUNTER_NAMES)))

    def elaborate(self, platform):
        m = Module()
        for k, name in enumerate(COUNTER_NAMES):
            cnt = Signal(32, name=f"cnt_{name}")
            events = getattr(self.inc, name)
            step = Signal(range(len(events) + 1), name=f"inc_{name}")
            m.d.sync += step.eq(sum(events[n] for n in range(len(events))))
            m.d.sync += cnt.eq(cnt + step)
            m.d.comb += self.values[k].eq(cnt)
        return m
