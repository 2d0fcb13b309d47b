"""Simulator at paper scale: a GPT-2 Large job (774M parameters) on 8 workers, beside
GPT-1B-sized background jobs on the same bottleneck, run to a target loss under each
controller.

Time advances one optimizer step at a time. A step of knobs (q, a) computes for
``a * t_compute`` (lognormal jitter), starts sending ``bytes(q)`` when the backward pass of
the last micro-batch is ``overlap`` done, and the transfer runs over the contention trace
(exact integration of the time-varying rate). Training progress follows the same
noise-scale model the controllers use (``costmodel``): each step advances
``1 / (1 + B_noise/B + rho_q(a))`` units out of ``S_min``, and B_noise grows geometrically
from ``b_noise_start`` to ``b_noise_end`` as training progresses (it grows as the loss
falls, McCandlish et al. sec. 3). The target loss is reached at S_min units of progress.

The controllers never see the truth: they see what a real job measures. Bandwidth is
bytes over each transfer's duration, compute is the jittered micro-step time, and B_noise
comes from the estimator fed with squared norms of simulated gradients. Those are drawn
as ``G + noise`` in ``grad_dims`` dimensions, where worker noise has variance
``tr(Sigma)/(a b)`` and the all-reduced gradient is the mean of the N workers.
Quantization error ratios come from ``kappa2`` (measured on real gradients, see docs).

A paced step (knob ``pace`` r < 1) sends at ``min(share, r * link)``, the contention
trace capped; the bandwidth meter then records the share the transfer would have had
unpaced (what ``CompressedCollective``'s meter approximates by leaving the pacer's waits
out). The result's ``cost`` integrates the objective's price ``1 + rate_price * r`` over
time (it equals the time when ``rate_price`` is 0).
"""

from dataclasses import dataclass, field

import numpy as np

from .contention import BackgroundJob, BandwidthTrace, LEVELS, background_trace
from ina_fabric.host.controller.controllers import Controller, Telemetry, make_controller
from ina_fabric.host.controller.costmodel import CostModel, JobParams
from ina_fabric.host.controller.knobs import Knobs, KnobSpace

__all__ = ["Scenario", "paper_scenario", "simulate", "SimResult", "compare_levels"]

GPU_FLOPS = 312e12 * 0.45        # A100 bf16 peak at 45% model FLOPs utilization


@dataclass
class Scenario:
    job: JobParams                       # our job; bandwidth = bottleneck capacity
    background: BackgroundJob
    b_noise_start: float
    b_noise_end: float
    s_min: float = 2000.0
    control_interval: float = 10.0      # seconds of simulated time
    compute_jitter: float = 0.03
    grad_dims: int = 256
    space: KnobSpace = field(default_factory=KnobSpace)

    def b_noise(self, progress_frac):
        return self.b_noise_start * (self.b_noise_end / self.b_noise_start) ** progress_frac


def paper_scenario(kappa2: float = None, **kw) -> Scenario:
    """GPT-2 Large (774M) on 8 workers behind 100 Gb/s links, in-network aggregation
    (each worker sends and receives one gradient per step), micro-batch 8 sequences of 1024
    tokens; background GPT-1B jobs (fp32 gradients, 8x1024 tokens per step)."""
    params, tokens = 774_000_000, 8 * 1024
    job = JobParams(params=params, workers=8, micro_batch=8,
                    t_compute=6 * params * tokens / GPU_FLOPS, bandwidth=12.5e9,
                    b_noise=64.0, s_min=1.0, wire_factor=1.0, overlap=0.5,
                    latency=1e-3, **({"kappa2": kappa2} if kappa2 is not None else {}))
    bg = BackgroundJob(grad_bytes=4 * 1_000_000_000,
                       t_compute=6 * 1_000_000_000 * tokens / GPU_FLOPS, jitter=0.1)
    return Scenario(job=job, background=bg, b_noise_start=64.0, b_noise_end=1024.0, **kw)


@dataclass
class SimResult:
    controller: str
    time_to_target: float
    steps: int
    changes: int
    log: dict          # per-step arrays: t, precision, accum, pace, bw_true, bw_meas, b_noise_est
    cost: float = None  # time to target times the price of each second (= time at lambda 0)

    def __post_init__(self):
        if self.cost is None:
            self.cost = self.time_to_target


def simulate(controller: Controller, sc: Scenario, trace: BandwidthTrace, seed: int = 0,
             horizon: float = np.inf) -> SimResult:
    rng = np.random.default_rng(seed)
    p0 = sc.job
    tel = Telemetry(base=p0.with_(b_noise=sc.b_noise_start))
    knobs = controller.current
    t, progress, steps, cost = 0.0, 0.0, 0, 0.0
    link = p0.link_rate or p0.bandwidth
    paced = {}                                   # pace -> the trace capped by the pacer
    next_control = sc.control_interval
    D, N, b = sc.grad_dims, p0.workers, p0.micro_batch
    r_q = {q: CostModel(p0).quant_ratio(q) for q in sc.space.precisions}
    wire_bytes = CostModel(p0).wire_bytes          # the job's path: Gloo or the switch
    G = np.full(D, 1.0 / np.sqrt(D))           # |G|^2 = 1, so tr(Sigma) = B_noise
    log = {k: [] for k in ("t", "precision", "accum", "pace", "bw_true", "bw_meas",
                           "b_noise_est", "b_noise_true")}
    while progress < sc.s_min and t < horizon:
        frac = progress / sc.s_min
        bn = sc.b_noise(frac)
        q, a, r = knobs.precision, knobs.accum, knobs.pace
        micro = p0.t_compute * rng.lognormal(0.0, sc.compute_jitter, a)
        t_comp = micro.sum()
        nbytes = p0.wire_factor * wire_bytes(q)
        start = t + t_comp - p0.overlap * micro[-1]
        if r < 1.0 and r not in paced:
            paced[r] = trace.capped(r * link)
        end = (paced[r] if r < 1.0 else trace).transfer_end(start, nbytes) + p0.latency
        t_next = max(t + t_comp, end)
        cost += (t_next - t) * (1.0 + p0.rate_price * r)
        # what the job measures (the share, not the pacer's cap)
        tel.bandwidth.record(nbytes, trace.transfer_end(start, nbytes) - start)
        tel.compute.record(t_comp, a)
        sd = np.sqrt(bn / (a * b * D))
        g_workers = G + sd * rng.standard_normal((N, D))
        tel.noise.record(a * b, float(g_workers[0] @ g_workers[0]), a * b * N,
                         float(np.square(g_workers.mean(0)).sum()))
        # progress under the model (quantization error ratio from kappa2)
        progress += 1.0 / (1.0 + bn / (a * b * N) + r_q[q] / N * (1.0 + bn / (a * b)))
        steps += 1
        log["t"].append(t)
        log["precision"].append(q)
        log["accum"].append(a)
        log["pace"].append(r)
        log["bw_true"].append(trace.mean_rate(start, end - p0.latency))
        log["bw_meas"].append(tel.bandwidth.value)
        log["b_noise_est"].append(tel.noise.value if tel.noise.value is not None else np.nan)
        log["b_noise_true"].append(bn)
        t = t_next
        if t >= next_control:
            knobs = controller.decide(tel.model())
            next_control = t + sc.control_interval
    return SimResult(controller.name, t, steps, controller.changes,
                     {k: np.asarray(v, float) for k, v in log.items()}, cost)


def compare_levels(sc: Scenario, levels=("light", "medium", "heavy"), controllers=None,
                   seed: int = 0, hysteresis: float = 0.05, horizon: float = 100_000.0):
    """Time to target for each controller under each constant contention level (the same
    trace for every controller of a level). Returns {level: {controller: SimResult}}."""
    from ina_fabric.host.controller.controllers import CONTROLLERS
    controllers = controllers or list(CONTROLLERS)
    out = {}
    for i, level in enumerate(levels):
        trace = background_trace(sc.job.bandwidth, sc.background, [(0.0, LEVELS[level])],
                                 horizon, seed=seed + 1000 * i)
        out[level] = {name: simulate(make_controller(name, sc.space, hysteresis=hysteresis),
                                     sc, trace, seed=seed) for name in controllers}
    return out
