"""Factories for ``host.ddp`` (``ina train --backends host.collectives.plugin:tar_udp``).

Each factory is ``f(rank, world, cfg) -> Collective`` with ``cfg`` the ``TrainConfig``;
the impairment comes from ``cfg`` (loss, delay_ms, p99_over_p50, duplicate, reorder,
seed), the rest from the environment (inherited by the forked workers):

* ``INA_TAR_DEADLINE_MS``: a fixed deadline per phase (default: the adaptive policy);
* ``INA_TAR_CALIBRATION``: calibration rounds of the adaptive policy (default 5);
* ``INA_TAR_ELEMENTS``: float32 entries per datagram (default 2048);
* ``INA_TAR_LOG``: a directory; each rank writes ``rank<r>.json`` with one record per
  allreduce call (time, lost fraction, deadlines) when training ends;
* ``INA_LIVE_SWITCH``: ``ip:port,ip:port`` of a ``LiveSwitch`` (data, control) for the
  adaptive in-network bounded mode (``switch_bounded``).

The TAR/ring mesh binds to the address that reaches torchrun's ``MASTER_ADDR`` (a lab
host's own address under ``ina train --lab``), or to loopback.
"""

import json
import os
import pathlib
import time

import numpy as np

from . import make_collective, SwitchTarget
from .base import Collective

__all__ = ["ring_tcp", "tar_tcp", "tar_udp", "tar_udp_hadamard", "tar_udp_nofill",
           "tar_udp_agree", "tar_udp_repair",
           "switch_reliable", "switch_bounded", "RecordingCollective"]

RECORD_KEYS = ("seconds", "entries", "entries_lost", "lost_fraction", "calibrating", "mode",
               "scatter_deadline", "bcast_deadline", "scatter_time", "bcast_time",
               "switch_deadline", "entries_missing", "dropped_fraction", "repaired_chunks", "partial_slots", "packets_lost")


class RecordingCollective(Collective):
    """Keeps one small record per call and writes them to ``log_dir`` at close."""

    def __init__(self, inner, log_dir=None):
        self.inner, self.rank, self.world = inner, inner.rank, inner.world
        self.name = inner.name
        self.log_dir = log_dir
        self.records = []
        self.t0 = time.perf_counter()

    def allreduce(self, x):
        out, st = self.inner.allreduce(x)
        rec = {"t": time.perf_counter() - self.t0}
        rec.update({k: st[k] for k in RECORD_KEYS if k in st})
        self.records.append(rec)
        return out, st

    def close(self):
        self.inner.close()
        if self.log_dir:
            p = pathlib.Path(self.log_dir)
            p.mkdir(parents=True, exist_ok=True)
            (p / f"rank{self.rank}.json").write_text(json.dumps(
                {"name": self.name, "records": self.records}, default=float))


def _make(kind, rank, world, cfg, **kw):
    env = os.environ
    dl = env.get("INA_TAR_DEADLINE_MS")
    opts = dict(elements=int(env.get("INA_TAR_ELEMENTS", 2048)),
                deadline=float(dl) / 1e3 if dl else None,
                calibration=int(env.get("INA_TAR_CALIBRATION", 5)), seed=cfg.seed)
    opts.update(kw)
    switch = None
    if kind.startswith("switch"):
        live = env.get("INA_LIVE_SWITCH")
        if not live:
            raise ValueError("switch collectives need INA_LIVE_SWITCH=ip:port,ip:port")
        (h, p), (ch, cp) = (a.rsplit(":", 1) for a in live.split(","))
        switch = SwitchTarget((h, int(p)), (ch, int(cp)), job=cfg.job, window=cfg.window)
        opts["elements"] = int(env.get("INA_TAR_ELEMENTS", cfg.elements))
    bind = "127.0.0.1"
    master = env.get("MASTER_ADDR")
    if master and not master.startswith("127.") and master != "localhost":
        from ..ddp.hook import local_address_towards
        bind = local_address_towards((master, 1))
    c = make_collective(kind, rank, world, None, impairment=cfg.uplink(rank), switch=switch,
                        bind=bind, **opts)
    return RecordingCollective(c, env.get("INA_TAR_LOG"))


def ring_tcp(rank, world, cfg):
    return _make("ring-tcp", rank, world, cfg)


def tar_tcp(rank, world, cfg):
    return _make("tar-tcp", rank, world, cfg)


def tar_udp(rank, world, cfg):
    return _make("tar-udp", rank, world, cfg)


def tar_udp_hadamard(rank, world, cfg):
    return _make("tar-udp", rank, world, cfg, hadamard=True)


def tar_udp_nofill(rank, world, cfg):
    return _make("tar-udp", rank, world, cfg, fill="zero")


def tar_udp_agree(rank, world, cfg):
    """Bounded TAR whose ranks agree on the missed chunks (zeroed everywhere): no drift."""
    return _make("tar-udp", rank, world, cfg, resolve="agree")


def tar_udp_repair(rank, world, cfg):
    """Bounded TAR that fetches only its missed broadcast chunks from their owners."""
    return _make("tar-udp", rank, world, cfg, resolve="repair")


def switch_reliable(rank, world, cfg):
    return _make("switch-reliable", rank, world, cfg)


def switch_bounded(rank, world, cfg):
    return _make("switch-bounded", rank, world, cfg)
