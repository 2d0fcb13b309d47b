"""The switch with its DATA path compiled: ``FastSwitchModel``.

``SwitchModel`` (``model.py``) is the definition of the aggregator. ``FastSwitchModel`` is
the same object with the per-datagram work of DATA moved into ``_engine.c`` (parse, job
and source lookup, slot rules, exact accumulation, results, deadlines); CONTROL,
STATUS_REQ and anything malformed still go through the model's Python code, and the job
table, admission limits and STATUS stay the model's. The two are differentially tested
(``tests/test_switch_engine.py``): the same random traffic, the same output datagrams and
counters, in both modes, with loss, duplicates and garbage.

``SwitchServer(engine="fast")`` runs ``Engine.serve``, the batch socket loop (``ppoll``,
``recvmmsg``, ``sendmmsg``); ``process``/``tick`` here are the pure forms the tests use.

The extension is built by ``pip install`` / ``make setup`` (``setup.py``); where no C
compiler was found it is missing, ``WHY_NOT`` says so, and the server falls back to the
model with that message.
"""

from collections import Counter
import socket

from ina_fabric.protocol.fields import HEADER_BYTES, VERSION, MsgType, c_layout, ERROR_INTERVAL
from ina_fabric.protocol.jobtable import MODES
from .model import SwitchModel, COUNTERS

_JOB = c_layout()["job"]

try:
    from . import _engine
    WHY_NOT = None
except ImportError as e:          # built without a C compiler, or not built at all
    _engine = None
    WHY_NOT = (f"the compiled switch engine is not built ({e}); install a C compiler "
               f"(apt-get install gcc) and run `make setup` (or `pip install .`) again")

__all__ = ["FastSwitchModel", "EngineUnavailable", "available", "WHY_NOT", "layout"]


class EngineUnavailable(RuntimeError):
    """``engine="fast"`` was asked for and the extension is not built (``WHY_NOT``)."""


def available() -> bool:
    return _engine is not None


def layout() -> dict:
    """What the engine needs of the wire format, from its one definition."""
    return c_layout()


def ip_int(ip: str) -> int:
    return int.from_bytes(socket.inet_aton(ip), "big")


_names: dict[int, str] = {}


def ip_str(ip: int) -> str:
    s = _names.get(ip)
    if s is None:
        s = _names[ip] = socket.inet_ntoa(ip.to_bytes(4, "big"))
    return s


class FastSwitchModel(SwitchModel):
    """``SwitchModel`` with the DATA path in ``_engine`` (same constructor)."""

    def __init__(self, jobs=(), **kw):
        if _engine is None:
            raise EngineUnavailable(WHY_NOT)
        self.engine = _engine.Engine(layout(), kw.get("answers", True), ERROR_INTERVAL)
        self._data = (VERSION, int(MsgType.DATA))
        self._result = (VERSION, int(MsgType.RESULT))
        super().__init__(jobs, **kw)
        if self.pool_slots is not None:
            self.engine.set_pool(self.pool_slots, (ip_int(self.parent[0]), self.parent[1]))

    @property
    def pool_used(self) -> int:
        return self.engine.pool_used()

    # -- the job table: the model's, mirrored into the engine ------------------------
    def add_job(self, cfg, now=None):
        js = self.jobs.get(cfg.job)
        if js is not None:          # the engine knows when the job last took DATA
            js.active = max(js.active, self.engine.active(cfg.job) or 0.0)
        super().add_job(cfg, now)
        self.engine.add_job(cfg.job, [(ip_int(m.ip), m.port) for m in cfg.members],
                            cfg.window, cfg.elements, MODES.index(cfg.mode), cfg.deadline,
                            [(ip_int(ip), port) for ip, port in self.jobs[cfg.job].group],
                            cfg.session, self.jobs[cfg.job].active,
                            (ip_int(cfg.parent[0]), cfg.parent[1]) if cfg.parent else None,
                            cfg.index, cfg.children, cfg.total)

    def remove_job(self, job: int, session: int = 0):
        super().remove_job(job, session)
        self.engine.remove_job(job)

    def start_at(self, job: int, seq: int):
        super().start_at(job, seq)
        self.engine.start_at(job, seq)

    def _retune(self, js, cfg):
        js.cfg = cfg
        self.engine.retune(cfg.job, MODES.index(cfg.mode), cfg.deadline)

    def _job_status(self, js) -> dict:
        st = super()._job_status(js)
        st["open_slots"] = self.engine.open_slots(js.cfg.job)
        if "position" in st:
            st["position"] = self.engine.position(js.cfg.job)
        if "absent" in st:
            st["absent"] = self._missing(js.cfg.n, ~self.engine.absent(js.cfg.job))
        return st

    def _awaiting_parent(self, js) -> int:
        return self.engine.awaiting_parent(js.cfg.job)

    def _waiting_for(self, js):
        bitmap = self.engine.oldest_open_bitmap(js.cfg.job)
        return [] if bitmap is None else self._missing(js.cfg.n, bitmap)

    def job_counters(self, job: int) -> dict:
        c = Counter(super().job_counters(job)) + Counter(self.engine.job_counters(job) or {})
        return dict(sorted(c.items()))

    @property
    def counters(self) -> Counter:
        c = Counter(self._counts)
        for name, v in self.engine.counters().items():
            if name in self._counts:
                c[name] += v
        return c

    def engine_counters(self) -> dict:
        """The engine's own figures (batches, send errors) besides the model's."""
        return {k: v for k, v in self.engine.counters().items() if k not in COUNTERS}

    # -- packets ---------------------------------------------------------------------
    @staticmethod
    def _out(pairs):
        return [((ip_str(ip), port), data) for ip, port, data in pairs]

    def is_data(self, datagram) -> bool:
        """DATA, or a RESULT of a job with a parent (a tree's RESULT coming down): what
        the engine takes."""
        if len(datagram) < HEADER_BYTES:
            return False
        if (datagram[0], datagram[1]) == self._data:
            return True
        return (datagram[0], datagram[1]) == self._result and self._has_parent(
            {"job": int.from_bytes(datagram[_JOB:_JOB + 2], "big")})

    def process(self, datagram, source, now: float):
        if self.is_data(datagram):
            return self._out(self.engine.process(datagram, ip_int(source[0]), source[1],
                                                 now))
        return self.tick(now) + self._receive(datagram, source, now)

    def tick(self, now: float):
        return self._out(self.engine.tick(now))

    def next_deadline(self):
        return self.engine.next_deadline()
