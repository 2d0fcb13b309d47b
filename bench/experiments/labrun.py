"""The controller on real links: our job and background training jobs in one ``ina lab``.

Scaled down from the paper (GPT-2 Large on 8 workers beside GPT-1B jobs, 100 Gb/s):

* our job: ``charlm`` (a 117k-parameter causal transformer on real text, 467 KB of fp32
  gradient) on 4 hosts of a ``rack`` lab, each host behind its own ``rate`` link (tbf at
  both ends) into a bridge; gradients all-gathered by ``CompressedCollective`` over Gloo
  (TCP through the bridge), so precision changes the bytes on the real links;
* background jobs: one rank on each of the same 4 hosts (tenants sharing a NIC), each a
  ring all-reduce over TCP of 1.3x our fp32 gradient per step (GPT-1B / GPT-2 Large =
  1.3), with a compute phase as long as that all-reduce takes alone on an idle link (the
  paper's background job at 100 Gb/s also spends about as long computing as
  communicating); they share every host's uplink and downlink queue with our job;
* contention changes over time: each level is a cycle of background-job counts
  (``LAB_LEVELS``), each count held for ``phase_s`` seconds of our training clock, jobs
  arriving and leaving; the seed rotates where in the cycle a run starts, and within a
  seed every controller sees the same schedule (a paired comparison).

Our job's compute per micro-step (8 sequences of 64 characters on one CPU thread, tens
of milliseconds) against the fp32 exchange on the link (hundreds of milliseconds beside
background jobs) puts it where the paper's 10 Gb/s case is: communication-bound at fp32.
"""

from dataclasses import asdict, dataclass, field
import json
import os
import sys
import tempfile
import time

from .realrun import ENV, RealSpec

__all__ = ["LabSetup", "LAB_LEVELS", "schedule_for", "start_background", "lab_run"]

# Background-job counts, cycled, one per phase: the mean is about 1 (light) and 3.3 (heavy).
LAB_LEVELS = {"none": [0], "light": [1, 0, 2, 1], "heavy": [4, 3, 4, 2]}


@dataclass
class LabSetup:
    hosts: int = 4
    rate: str = "50mbit"           # every host link, each way
    queue_ms: float = 20.0
    workload: str = "charlm"
    phase_s: float = 10.0           # seconds of training per background-job count
    horizon: float = 600.0          # bound on every run (seconds)
    bg_ratio: float = 1.3           # background gradient / our fp32 gradient
    control_interval: int = 5       # optimizer steps between decisions
    eval_every_samples: int = 512
    lr_scaling: str = "sqrt"
    accums: tuple = (1, 2, 4, 8, 16)
    precisions: tuple = (32, 16, 8, 4)
    #: sequences per worker per micro-step (charlm: 8 until 2026-12-04)
    micro_batch: int = 8
    #: how our messages travel (``CompressedCollective.exchange``): "ring" or "direct"
    exchange: str = "ring"
    #: the pace knob's choices and the objective's price of a whole link (``costmodel``);
    #: (1.0,) and 0: no pacing, time to target alone
    paces: tuple = (1.0,)
    rate_price: float = 0.0
    #: how our gradients are summed: "gloo" (all-gathered, ``exchange``) or "switch" (in
    #: the lab's ``ina switch``, ``switchpath.CompressedSwitchCollective``)
    path: str = "gloo"
    lab_id: str = "ctl"
    base_port: int = 6200
    extra: dict = field(default_factory=dict)   # more TrainConfig fields

    def capacity(self) -> float:
        """Bytes/s of one link, one way."""
        from ina_fabric.host.lab.topology import parse_rate
        return parse_rate(self.rate) / 8.0


def schedule_for(level: str, seed: int, phase_s: float, horizon: float):
    """[(t, background jobs)] for ``level``, its cycle rotated by ``seed``."""
    cycle = LAB_LEVELS[level]
    out, k, t = [], seed % len(cycle), 0.0
    while t < horizon:
        out.append((t, cycle[k % len(cycle)]))
        k += 1
        t += phase_s
    return out


def start_background(lab, hosts, schedule, nbytes, compute, epoch_file, seconds, seed=0,
                     base_port=6200):
    """Every background job of ``schedule`` (job j present while the count exceeds j),
    one rank per host; returns the processes (each ends by itself within ``seconds``)."""
    from ina_fabric.host.lab.bgjob import intervals_for
    import subprocess
    procs = []
    n_jobs = max(n for _, n in schedule)
    world = len(hosts)
    for j in range(n_jobs):
        active = intervals_for(schedule, j, seconds)
        spec = ",".join(f"{a:g}:{b:g}" for a, b in active)
        for r, h in enumerate(hosts):
            nxt = hosts[(r + 1) % world]
            argv = [sys.executable, "-m", "ina_fabric.host.lab.bgjob", "--rank", r, "--world",
                    world, "--port", base_port + j, "--next",
                    f"{lab.address(nxt)}:{base_port + j}", "--bytes", int(nbytes),
                    "--compute", compute, "--active", spec, "--epoch-file", epoch_file,
                    "--seconds", seconds, "--seed", seed * 100 + j]
            procs.append(lab.popen(h, argv, stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, text=True))
    return procs


def stop_background(procs):
    """Stop every background rank (they may be waiting for a schedule that the run
    outlived); returns their summaries."""
    import signal
    out = []
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    for p in procs:
        try:
            text, _ = p.communicate(timeout=10)
        except Exception:
            os.killpg(p.pid, 9)
            text, _ = p.communicate()
        for line in (text or "").splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
    return out


def lab_run(lab, setup: LabSetup, controller: str, level: str, seed: int, script=None,
            timeout=None, log_path=None, progress=None):
    """One training run of our job beside the level's background jobs in ``lab``; returns
    (TrainResult, schedule, controller log)."""
    from ina_fabric.host.ddp.train import TrainConfig, run_training_lab
    from ina_fabric.host.controller.compress import message_bytes
    hosts = lab.hosts[:setup.hosts]
    schedule = schedule_for(level, seed, setup.phase_s, setup.horizon)
    fd, epoch_file = tempfile.mkstemp(prefix="ina-ctl-epoch-")
    os.close(fd)
    os.unlink(epoch_file)
    own_log = log_path is None
    if own_log:
        fd, log_path = tempfile.mkstemp(prefix="ina-ctl-log-", suffix=".json")
        os.close(fd)
    params = _params(setup.workload)
    nbytes = setup.bg_ratio * 4 * params
    cap = setup.capacity()
    # a background job alone: 2(N-1)/N of its gradient on each uplink, at the link rate
    compute = 2 * (len(hosts) - 1) / len(hosts) * nbytes / cap
    spec = RealSpec(controller=controller, capacity=cap, schedule=schedule,
                    horizon=setup.horizon, seed=seed, precisions=tuple(setup.precisions),
                    accums=tuple(setup.accums), throttle=False, epoch_file=epoch_file,
                    log_path=log_path, script=script, progress=progress,
                    exchange=setup.exchange, paces=tuple(setup.paces),
                    rate_price=setup.rate_price, path=setup.path)
    cfg = TrainConfig(workload=setup.workload, workers=len(hosts), seed=seed,
                      backend="ina_fabric.bench.experiments.realrun:collective",
                      controller="ina_fabric.bench.experiments.realrun:controller",
                      control_interval=setup.control_interval, max_epochs=1000,
                      eval_every_samples=setup.eval_every_samples,
                      lr_scaling=setup.lr_scaling, batch=setup.micro_batch,
                      **setup.extra)
    procs = start_background(lab, hosts, schedule, nbytes, compute, epoch_file,
                             setup.horizon + 30, seed, setup.base_port) if \
        max(n for _, n in schedule) else []
    os.environ[ENV] = json.dumps(asdict(spec))
    try:
        res = run_training_lab(cfg, lab, timeout=timeout or setup.horizon + 120)
    finally:
        os.environ.pop(ENV, None)
        bg = stop_background(procs)
        for f in (epoch_file,):
            if os.path.exists(f):
                os.unlink(f)
    log = []
    try:
        with open(log_path) as f:
            log = json.load(f)
    except (OSError, ValueError):
        pass
    if own_log:
        os.unlink(log_path)
    return res, schedule, log, bg


def _params(workload):
    from ina_fabric.host.ddp.workloads import get_workload
    return sum(p.numel() for p in get_workload(workload, 0).model.parameters())


def main_smoke():      # pragma: no cover - a manual check
    from ina_fabric.host.lab import training_lab
    setup = LabSetup()
    lab, _, _ = training_lab("rack", setup.hosts, {"rate": setup.rate, "mtu": 1500,
                                                    "queue_ms": setup.queue_ms},
                             lab_id=setup.lab_id)
    try:
        t = time.time()
        res, sched, log, bg = lab_run(lab, setup, "joint", "heavy", 0)
        print(time.time() - t, res.time_to_loss, res.samples_to_loss, res.steps,
              res.loss_curve[-3:], res.knobs[-5:], bg)
        for e in log[::4]:
            print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in e.items()
                   if k != "quant_ratio"})
    finally:
        lab.down()
