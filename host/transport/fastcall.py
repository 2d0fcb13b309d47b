"""The worker's allreduce call compiled (``_client.c``), and its window for the tests.

``SwitchClient.allreduce`` runs a call here when the extension is built and the uplink is
not impaired (impairment wraps the Python socket, so an impaired client runs the Python
loop). The Python modules stay the definition: ``window.SendWindow`` (the C ``Window`` is
the same state machine; ``CSendWindow`` below gives it SendWindow's interface, and
``tests/test_window_machine.py`` runs its properties on both), ``AllreduceCall`` (packets,
results) and ``quantize`` (the same float64 arithmetic, bit for bit: a test compares the
two loops' outputs on the same inputs).

Where no C compiler was found at install time the extension is missing: ``WHY_NOT``
says so, and the client runs the Python loop.
"""

import numpy as np

from .window import (Send, Deliver, Abandon, Hold, Fail, RttEstimator, WindowConfig)

try:
    from . import _client
    WHY_NOT = None
except ImportError as e:
    _client = None
    WHY_NOT = (f"the compiled client is not built ({e}); install a C compiler (apt-get "
               f"install gcc) and run `make setup` (or `pip install .`) again")

__all__ = ["available", "WHY_NOT", "CSendWindow", "run_call", "exponents", "STATS",
           "CallFailed"]

#: the order of the C call's statistics (``AllreduceStats`` fields)
STATS = ("packets_sent", "retransmits", "results", "duplicates_ignored", "partial_slots",
         "entries_lost", "overflow_slots", "clipped", "abandoned_slots", "foreign_ignored",
         "refetched", "local_retries", "coalesced_waits", "local_waits")
#: ``RttEstimator``'s fields in the C window's float64 array (``_client.c``'s T_*)
_RTT = ("srtt", "rttvar", "answered", "peak", "last_peak", "cwnd", "ssthresh", "base_rtt",
        "cut_at", "cuts", "congested_at")
_KINDS = {1: lambda p, f: Send(p, bool(f)), 2: lambda p, f: Deliver(p),
          3: lambda p, f: Abandon(p), 4: lambda p, f: Hold(p),
          5: lambda p, f: Fail(("unavailable", "stalled")[p])}
UNAVAILABLE, STALLED, INCONSISTENT, TOO_LATE, REFUSED, MEMBERS_DIFFER = 1, 2, 3, 4, 5, 6


def available() -> bool:
    return _client is not None


_said = False


def say_why_not():
    """Warn once per process that calls run the Python loop, and why."""
    global _said
    if not _said:
        import warnings
        _said = True
        warnings.warn(f"INA: allreduce runs the Python loop (slower): {WHY_NOT}",
                      RuntimeWarning, stacklevel=3)


def config_tuple(cfg: WindowConfig):
    return (1.0 if cfg.mode == "bounded" else 0.0, cfg.rto, cfg.min_rto, cfg.deadline,
            cfg.connect_timeout, cfg.stall_timeout, cfg.start_wait,
            {"off": 0.0, "aimd": 1.0, "delay": 2.0}[cfg.congestion])


def rtt_to_array(rtt: RttEstimator, arr=None):
    arr = np.empty(len(_RTT), np.float64) if arr is None else arr
    arr[:] = [float(getattr(rtt, k)) for k in _RTT]
    return arr


def rtt_from_array(rtt: RttEstimator, arr):
    for i, k in enumerate(_RTT):
        setattr(rtt, k, float(arr[i]))
    rtt.answered = bool(arr[2])


class CSendWindow:
    """The C window behind ``SendWindow``'s interface; ``rtt`` (a ``RttEstimator``) is
    kept in step after every event."""

    def __init__(self, packets, window, cfg: WindowConfig, rtt: RttEstimator | None = None):
        self.cfg = cfg
        self.rtt = rtt if rtt is not None else RttEstimator()
        self._arr = rtt_to_array(self.rtt)
        self._w = _client.Window(packets, window, config_tuple(cfg), self._arr)
        self.P, self.W = packets, window
        rtt_from_array(self.rtt, self._arr)

    def _acts(self, raw):
        rtt_from_array(self.rtt, self._arr)
        return [_KINDS[k](p, f) for k, p, f in raw]

    def start(self, now):
        return self._acts(self._w.start(now))

    def on_result(self, p, now, congested=False):
        return self._acts(self._w.on_result(p, now, bool(congested)))

    def on_timer(self, now):
        return self._acts(self._w.on_timer(now))

    def on_local_congestion(self, now):
        return self._acts(self._w.on_local_congestion(now))

    def next_wakeup(self):
        return self._w.next_wakeup()

    def rto(self):
        return self._w.rto()

    def coalesce(self):
        return self._w.coalesce()

    def timeout(self):
        return self._w.timeout()

    @property
    def remaining(self):
        return self._w.state()[0]

    @property
    def done(self):
        return not self.remaining

    @property
    def inflight(self):
        return self._w.state()[1]

    @property
    def started(self):
        return bool(self._w.state()[2])

    @property
    def last_progress(self):
        return self._w.state()[3]

    def limit(self):
        return self._w.state()[4]


def exponents(x, elements, out) -> int:
    """``quantize._exponents`` compiled (a vectorized integer max per chunk): the local
    exponent of each chunk of ``x`` (float32) into ``out`` (int8); returns the first chunk
    holding inf or NaN, or -1."""
    from .quantize import NO_EXPONENT
    return _client.exponents(x, elements, out, NO_EXPONENT)


class CallFailed(Exception):
    """A compiled call ended without its results: ``code`` (UNAVAILABLE, STALLED,
    INCONSISTENT, TOO_LATE, REFUSED, or -errno) and the packets still ``remaining``;
    REFUSED: the switch's ERROR (``reason``, ``figure``) answered packet ``p`` (-1: a
    DATA of an earlier call) of ``seq``."""

    def __init__(self, code, remaining, reason=0, figure=0, p=0, seq=0):
        super().__init__(code, remaining)
        self.code, self.remaining = code, remaining
        self.reason, self.figure, self.p, self.seq = reason, figure, p, seq


def run_call(layout, fds, switch, x, out, ring, local_exp, job, worker, nworkers,
             elements, base, window, cfg: WindowConfig, rtt: RttEstimator, stats,
             session=0, pace_rate=0.0, missed=None, bits=32, stochastic=False, seed=0,
             stale_after=0, gso=True):
    """One call through the C loop; ``stats`` (an ``AllreduceStats``) and ``rtt`` are
    updated; ``pace_rate`` (bit/s, 0: none) spaces the datagrams at that rate;
    ``missed``: carry mode (``AllreduceCall``'s), a uint8 flag per chunk; ``bits``,
    ``stochastic``, ``seed``: the call's precision (docs/precision.md); ``stale_after``:
    a STALE answer whose figure (the job's position) is more than this past ``base``
    says this worker is behind (``AllreduceCall.stale_behind``); ``gso``: a run of
    datagrams of one length goes as one UDP GSO send. Raises CallFailed."""
    import socket
    arr = rtt_to_array(rtt)
    counts = np.zeros(len(STATS), np.int64)
    ip = int.from_bytes(socket.inet_aton(switch[0]), "big")
    try:
        code, remaining, reason, figure, p, seq = _client.run_call(layout, tuple(fds), ip, switch[1], x, out, ring,
                                           local_exp, job, worker, nworkers, elements,
                                           base, window, config_tuple(cfg), arr, counts,
                                           session, float(pace_rate or 0.0), missed,
                                           int(bits), bool(stochastic),
                                           int(seed) & ((1 << 64) - 1),
                                           int(stale_after) & 0xFFFFFFFF, bool(gso))
    finally:
        rtt_from_array(rtt, arr)
        for name, v in zip(STATS, counts.tolist()):
            setattr(stats, name, getattr(stats, name) + v)
    if code:
        raise CallFailed(code, remaining, reason, figure, p, seq)
