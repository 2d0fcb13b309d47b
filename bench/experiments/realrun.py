"""The controller in real training: plug-ins for ``host.ddp.train.run_training``.

``run_training`` takes a collective factory (``backend="ina_fabric.bench.experiments.realrun:collective"``)
and a controller factory (``controller="ina_fabric.bench.experiments.realrun:controller"``), both
``"module:factory"`` strings that cross into the spawned worker processes. What they
need beyond ``TrainConfig`` travels in the environment variable ``INA_CONTROL_SPEC``
(JSON of ``RealSpec``), which ``real_run`` sets.

* ``collective(rank, world, cfg)``: a ``CompressedCollective`` on every rank, throttled
  by a token bucket whose rate is our share of a bottleneck beside background jobs
  (``contention.background_trace``), so precision changes real bytes and real time.
* ``controller(cfg)``: on rank 0, every ``control_interval`` optimizer steps, turns the
  measurements (bytes and seconds of each exchange, compute seconds, gradient norms,
  quantization errors) into a ``Telemetry`` model and asks the chosen controller for
  ``precision_bits`` and ``accum_steps``; rank 0 broadcasts them to every rank.
"""

from dataclasses import asdict, dataclass, field
import json
import os
import time

from .contention import BackgroundJob, background_trace
from ina_fabric.host.controller.controllers import Telemetry, make_controller
from ina_fabric.host.controller.costmodel import CostModel, JobParams
from ina_fabric.host.controller.measure import Ewma
from ina_fabric.host.controller.knobs import Knobs, KnobSpace

__all__ = ["RealSpec", "collective", "controller", "real_run", "ENV"]

ENV = "INA_CONTROL_SPEC"


@dataclass
class RealSpec:
    controller: str = "joint"
    capacity: float = 20e6                # bytes/s of each worker's bottleneck link
    schedule: list = field(default_factory=lambda: [(0.0, 2)])   # (t, background jobs)
    bg_bytes: float = 2e6                 # background job: bytes per step
    bg_compute: float = 0.2               # background job: seconds of compute per step
    horizon: float = 3600.0
    seed: int = 0
    hysteresis: float = 0.05
    precisions: tuple = (32, 16, 8, 4)
    # a <= micro-batches per epoch per worker (digits, 4 workers: 11): host.ddp's loop
    # restarts its micro-step count every epoch, so a larger a would never step
    accums: tuple = (1, 2, 4, 8)
    b_noise_prior: float = 64.0
    log_path: str | None = None           # controller's per-interval log (JSON)
    script: list | None = None            # [(from step, bits, accum[, pace])]: fixed knobs
    # False: no token bucket; the links themselves limit (a lab run, ``labrun``)
    throttle: bool = True
    epoch_file: str | None = None         # rank 0 writes the training clock's start here
    # a fitted ``progress.ProgressModel`` (as a dict): the noise scale then comes from it at
    # the current (smoothed) training loss instead of the online estimator
    progress: dict | None = None
    # how the messages travel: "ring" (Gloo's all-gather) or "direct" (to every peer at once)
    exchange: str = "ring"
    # the pace knob: the choices (fractions of ``capacity``, each worker's link; (1.0,):
    # no pacing) and the objective's price of holding the whole link (``costmodel``)
    paces: tuple = (1.0,)
    rate_price: float = 0.0
    # how the gradients are summed: "gloo" (``exchange`` above, CompressedCollective) or
    # "switch" (in the switch that INA_SWITCH names: ``switchpath.CompressedSwitchCollective``)
    path: str = "gloo"

    def trace(self):
        return background_trace(self.capacity, BackgroundJob(self.bg_bytes, self.bg_compute),
                                [tuple(s) for s in self.schedule], self.horizon, self.seed)

    def space(self):
        return KnobSpace(tuple(self.precisions), tuple(self.accums),
                         paces=tuple(float(r) for r in self.paces))


def _spec() -> RealSpec:
    text = os.environ.get(ENV)
    if not text:
        raise ValueError(f"{ENV} is not set: start runs with bench.experiments.realrun.real_run")
    return RealSpec(**json.loads(text))


def collective(rank, world, cfg):
    from ina_fabric.host.controller.compress import CompressedCollective
    spec = _spec()
    bits = 32
    if spec.script and min(spec.script)[0] == 0:
        bits = int(min(spec.script)[1])     # scripted from the first step on
    if spec.path == "switch":
        if spec.throttle:
            raise ValueError("the switch path runs on real links (throttle=False): the "
                             "token bucket throttles only the Gloo path")
        from ina_fabric.host.controller.switchpath import switch_collective_from_env
        return switch_collective_from_env(rank, world, bits=bits, seed=cfg.seed,
                                          epoch_file=spec.epoch_file)
    return CompressedCollective(rank, world, bits=bits,
                                rate_fn=spec.trace() if spec.throttle else None,
                                seed=cfg.seed, epoch_file=spec.epoch_file,
                                exchange=spec.exchange, link_rate=spec.capacity)


class RealController:
    """Adapter from ``run_training``'s ``on_step(info)`` to a ``Controller``."""

    def __init__(self, cfg, spec: RealSpec):
        self.cfg, self.spec = cfg, spec
        self.ctl = make_controller(spec.controller, spec.space(), hysteresis=spec.hysteresis)
        self.tel = None
        self.last = {"step": 0, "compute": 0.0, "wall": 0.0}
        self.knobs = self.ctl.current
        self.log = []
        self.sync = Ewma(0.7)
        self.train_loss = Ewma(0.8)
        self.progress = None
        if spec.progress:
            from .progress import ProgressModel
            self.progress = ProgressModel.from_dict(spec.progress)

    def _base(self, info, elements):
        w = self.cfg.workers
        return JobParams(params=max(int(elements), 1), workers=w,
                         micro_batch=max(int(info["batch"]) // w, 1), t_compute=0.0,
                         bandwidth=self.spec.capacity, b_noise=self.spec.b_noise_prior,
                         wire_factor=1.0 if self.spec.path == "switch" else
                         float(max(w - 1, 1)), link_rate=self.spec.capacity,
                         rate_price=self.spec.rate_price, path=self.spec.path)

    def on_step(self, info: dict) -> dict:
        from ina_fabric.host.controller.compress import current_collective
        coll = current_collective()
        m = coll.take_measurements() if coll is not None else None
        dsteps = info["step"] - self.last["step"]
        dcomp = info["compute_seconds"] - self.last["compute"]
        wall = info.get("train_seconds")
        dwall = wall - self.last["wall"] if wall is not None else None
        self.last = {"step": info["step"], "compute": info["compute_seconds"],
                     "wall": wall or 0.0}
        if dsteps <= 0 or m is None or m["calls"] == 0:
            return {}
        a, w = self.knobs.accum, self.cfg.workers
        if self.tel is None:
            self.tel = Telemetry(base=self._base(info, m["elements"] / dsteps))
        tel = self.tel
        # backward() returns only when the exchange is done: take it out of compute, and
        # the codec's CPU time too (a cost per exchange: left in compute, it was charged
        # per micro-step, a times over at accumulation a)
        comm = m["sync_s"] + m["fixed_s"] + m["seconds"]
        codec = m.get("codec_s", 0.0)
        tel.compute.record(max(dcomp - comm - codec, 0.0), dsteps * a)
        if m["byte_s"] > 0:
            tel.bandwidth.record(m["bytes"], m["byte_s"])
        # fixed cost per communication (per optimizer step): the header phase (waiting
        # for the slowest worker, and its own trip) and the fixed part of the payload's
        # (until 2026-12-04 the header's trip was counted twice: sync + 2 fixed)
        # and what an optimizer step costs outside forward and backward (the optimizer,
        # the knob broadcast, data indexing): wall time not in compute, per step. Both
        # are per step whatever a is, so they go to the cost model with the latency.
        overhead = max(dwall - dcomp, 0.0) / dsteps if dwall is not None else 0.0
        self.sync.update((m["sync_s"] + m["fixed_s"] + codec) / dsteps + overhead)
        b = tel.base.micro_batch * a
        if w > 1:
            tel.noise.record(b, m["small_sq"] / dsteps, b * w, m["big_sq"] / dsteps)
        if m["rq_n"]:
            tel.quant.record_all({q: r / m["rq_n"] for q, r in m["rq_sum"].items()})
        extra = {"latency": self.sync.value}
        if self.progress is not None and info.get("loss") is not None:
            extra["b_noise"] = self.progress.b_noise_at_loss(self.train_loss.update(info["loss"]))
        model = CostModel(tel.params().with_(**extra))
        self.knobs = self.ctl.decide(model)
        if self.spec.script:
            for start, bits, acc, *pace in sorted(self.spec.script):
                if info["step"] >= start:
                    self.knobs = Knobs(int(bits), int(acc), float(pace[0]) if pace else 1.0)
        p = model.p
        self.log.append({"time": info["time"], "step": info["step"], "epoch": info["epoch"],
                         "precision": self.knobs.precision, "accum": self.knobs.accum,
                         "pace": self.knobs.pace, "pace_wait_s": m.get("pace_wait_s", 0.0),
                         "bandwidth": p.bandwidth, "t_compute": p.t_compute,
                         "b_noise": p.b_noise, "latency": p.latency, "bytes": m["bytes"], "comm_s": m["seconds"],
                         "calls": m["calls"], "steps": dsteps, "sync_s": m["sync_s"],
                         "codec_s": codec, "overhead_s": overhead * dsteps,
                         "quant_ratio": {str(k): v for k, v in p.quant_ratio.items()}})
        if self.spec.log_path:
            with open(self.spec.log_path, "w") as f:
                json.dump(self.log, f)
        return {"precision_bits": self.knobs.precision, "accum_steps": self.knobs.accum,
                "pace": self.knobs.pace}


def controller(cfg):
    return RealController(cfg, _spec())


def real_run(spec: RealSpec, workload="digits", workers=4, seed=0, control_interval=5,
             max_epochs=60, target=None, timeout=900, **train_kw):
    """One training run with the given controller under the spec's contention; returns
    the ``TrainResult``."""
    from ina_fabric.host.ddp.train import TrainConfig, run_training
    os.environ[ENV] = json.dumps(asdict(spec))
    try:
        cfg = TrainConfig(workload=workload, workers=workers, seed=seed,
                          backend="ina_fabric.bench.experiments.realrun:collective",
                          controller="ina_fabric.bench.experiments.realrun:controller",
                          control_interval=control_interval, max_epochs=max_epochs,
                          target=target, **train_kw)
        return run_training(cfg, timeout=timeout)
    finally:
        os.environ.pop(ENV, None)
