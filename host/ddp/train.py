"""Data-parallel training on this machine: a switch and N worker processes, PyTorch DDP
with the INA comm hook (or plain Gloo), on a workload from ``workloads``.

``run_training(TrainConfig(...))`` returns a ``TrainResult`` with the accuracy curve
against wall time, time-to-accuracy, aggregation statistics and a hash of every rank's
parameters. ``ina train`` is the command-line face of it.

Plug-in points (strings, so they cross process boundaries):

* ``backend``: ``gloo``, ``ina`` (switch, reliable), ``ina-bounded``, ``ina-skip``
  (bounded, skipping a straggler after one deadline: mode ``bounded-skip``),
  ``ina-skip-carry`` (the same, and a left-out contribution goes with the next step
  instead of the partial sums being rescaled), or
  ``"package.module:factory"``: ``factory(rank, world, cfg)`` returns a collective with
  ``allreduce(np.ndarray) -> (np.ndarray, stats)`` that the DDP hook will use.
* ``controller``: ``"package.module:factory"``; ``factory(cfg)`` returns an object with
  ``on_step(info: dict) -> dict`` called on rank 0 every ``control_interval`` optimizer
  steps. ``info`` has step, epoch, time, loss, comm_seconds, compute_seconds, bytes,
  accum_steps, precision_bits and batch (``compute_seconds`` is forward+backward wall
  time, which includes any wait for the comm hook at the end of backward). It may return ``accum_steps``, ``precision_bits`` and ``pace``; rank 0
  broadcasts them so every rank applies the same knobs. ``precision_bits`` is passed to
  the collective's ``set_precision(bits)`` and ``pace`` (a fraction of the link, to a
  thousandth) to its ``set_pace(pace)`` when it has them.
"""

from dataclasses import dataclass, field, asdict
import hashlib
import importlib
import os
import time

from ina_fabric.protocol.jobtable import LINK_DEFAULTS

__all__ = ["TrainConfig", "TrainResult", "run_training", "load_factory", "LR_SCALING",
           "scaled_lr"]

# exponent of the batch ratio in the learning-rate rule
LR_SCALING = {"none": 0.0, "sqrt": 0.5, "linear": 1.0}
#: the in-network backends: their switch job modes (``jobtable.MODES``), and whether a
#: worker's left-out contribution goes with its next call (``SwitchClient.carry``)
INA_BACKENDS = {"ina": ("reliable", False), "ina-bounded": ("bounded", False),
                "ina-skip": ("bounded-skip", False), "ina-skip-carry": ("bounded-skip", True)}


def scaled_lr(base: float, accum: int, rule: str) -> float:
    """The learning rate at accumulation ``accum`` when ``base`` is the one for a=1 (same
    micro-batch and workers, so the batch ratio is ``accum``)."""
    return base * accum ** LR_SCALING[rule]

_LOOPBACK = LINK_DEFAULTS["loopback"]


@dataclass
class TrainConfig:
    workload: str = "digits"
    workers: int = 4
    backend: str = "ina"
    target: float | None = None       # test accuracy to stop at (default: workload's)
    max_epochs: int = 60
    max_steps: int | None = None      # stop after this many optimizer steps
    seed: int = 0
    lr: float | None = None
    batch: int | None = None          # per worker, per micro-step
    accum_steps: int = 1
    momentum: float = 0.9
    # transport / switch
    switch: str | None = None         # external switch (FPGA or remote ina switch)
    switch_engine: str = "auto"       # the switch started here: auto, fast, model, rtl
    job: int = 1
    elements: int = _LOOPBACK.elements   # per packet (LINK_DEFAULTS: loopback)
    window: int = _LOOPBACK.window
    #: bounded mode's slot deadline; None: derived from the link rate and the ranks'
    #: timeouts (``host.deadline``, moved live by rank 0)
    deadline_ms: float | None = _LOOPBACK.deadline_ms
    #: the derived deadline's rule (``slot_deadline.RULES``): ``derived`` (wire + 2 rto)
    #: or ``loss-aware`` (one window more than the wire while no RESULT is lost)
    deadline_rule: str = "loss-aware"
    static_job: bool = False          # the switch has the job already (FPGA): no CONTROL
    worker_base_port: int = 0         # with static_job: worker r binds this + r
    session: int = 0                  # with static_job: the session id of the job it holds
    #: a switch that cannot be used at setup: "gloo" (every rank falls back together,
    #: with a warning on every rank and in the table) or "never" (every rank raises);
    #: None: INA_FALLBACK, else ``default_fallback`` (never for a static job, else gloo)
    fallback: str | None = None
    # uplink impairment (userspace, per worker, seeded)
    loss: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    delay_ms: float = 0.0
    p99_over_p50: float = 1.0
    controller: str | None = None
    control_interval: int = 10
    stop_at_target: bool = True
    eval_every: int = 0               # optimizer steps between evaluations (0: each epoch)
    eval_every_samples: int = 0       # or: global training samples between evaluations
    # test loss to stop at (default: the workload's target_loss when it has one and
    # ``target`` is not set); an evaluation then also reports the test loss
    target_loss: float | None = None
    # learning rate when accumulation sets the global batch B = a b N: ``lr`` is the rate
    # at a=1 and a run at a uses lr * a^p: "none" p=0 (keep it), "sqrt" p=1/2 (Adam:
    # Malladi et al. 2022), "linear" p=1 (SGD: Goyal et al. 2017)
    lr_scaling: str = "none"
    threads: int = 1                  # torch threads per worker
    # compute stragglers: before each optimizer step's last forward pass, every rank in
    # ``straggler_ranks`` ("all", or comma-separated ranks) sleeps a lognormal draw with
    # this median and P99/P50, seeded by (seed, step, rank): the same on every backend
    straggler_ms: float = 0.0
    straggler_p99_over_p50: float = 3.0
    straggler_ranks: str = "all"
    time_gloo: bool = False           # gloo: a timing comm hook records each allreduce

    def resolved_fallback(self) -> str:
        """gloo or never: INA_FALLBACK (gloo, never; raise = never) over ``fallback``
        over ``default_fallback``."""
        env = os.environ.get("INA_FALLBACK", "").strip().lower()
        if env:
            if env not in ("gloo", "never", "raise"):
                raise ValueError(f"INA_FALLBACK={env!r}: expected gloo or never")
            return "never" if env == "raise" else env
        return self.fallback or default_fallback(self.static_job)

    def straggler_delay(self, rank: int, step: int) -> float:
        """Seconds rank ``rank`` sleeps before step ``step`` (0 when not a straggler)."""
        if self.straggler_ms <= 0:
            return 0.0
        if self.straggler_ranks != "all" and \
                rank not in {int(r) for r in self.straggler_ranks.split(",")}:
            return 0.0
        import numpy as np
        sigma = np.log(max(self.straggler_p99_over_p50, 1.0)) / 2.3263478740408408
        z = np.random.default_rng([self.seed, step, rank, 0x57A6]).standard_normal()
        return self.straggler_ms / 1e3 * float(np.exp(sigma * z))

    def uplink(self, rank: int):
        """This rank's uplink ``Impairment`` (seeded per rank): the one place the
        impairment settings above become a policy."""
        from ..transport.impair import Impairment
        return Impairment(loss=self.loss, duplicate=self.duplicate, reorder=self.reorder,
                          delay_median=self.delay_ms / 1e3, p99_over_p50=self.p99_over_p50,
                          seed=self.seed * 1000 + rank + 1)

    def validate(self):
        if not 1 <= self.workers <= 32:
            raise ValueError(f"workers={self.workers}: need 1..32")
        if self.fallback not in (None, "gloo", "never"):
            raise ValueError(f"fallback {self.fallback!r}: expected gloo or never")
        self.resolved_fallback()
        if self.straggler_ms < 0 or self.straggler_p99_over_p50 < 1:
            raise ValueError("straggler_ms >= 0 and straggler_p99_over_p50 >= 1")
        if self.straggler_ranks != "all":
            try:
                bad = [r for r in self.straggler_ranks.split(",")
                       if not 0 <= int(r) < self.workers]
            except ValueError:
                bad = [self.straggler_ranks]
            if bad:
                raise ValueError(f"straggler_ranks {self.straggler_ranks!r}: 'all' or "
                                 f"comma-separated ranks below {self.workers}")
        if self.accum_steps < 1:
            raise ValueError(f"accum_steps={self.accum_steps}: need >= 1")
        from ..deadline import RULES
        if self.deadline_rule not in RULES:
            raise ValueError(f"deadline_rule={self.deadline_rule!r}: one of {', '.join(RULES)}")
        if self.lr_scaling not in LR_SCALING:
            raise ValueError(f"lr_scaling={self.lr_scaling!r}: one of {', '.join(LR_SCALING)}")
        if self.backend != "gloo" and self.backend not in INA_BACKENDS and \
                ":" not in self.backend:
            raise ValueError(f"backend {self.backend!r}: gloo, {', '.join(INA_BACKENDS)} "
                             "or module:factory")
        from .workloads import WORKLOADS
        if self.workload not in WORKLOADS:
            raise ValueError(f"unknown workload {self.workload!r}; have {', '.join(WORKLOADS)}")
        if self.switch_engine not in ("auto", "fast", "model", "rtl", "board"):
            raise ValueError(f"switch_engine {self.switch_engine!r}: auto, fast, model, "
                             "rtl or board")
        if self.switch_engine != "auto" and self.switch:
            raise ValueError("switch_engine chooses the switch started here; with switch "
                             "(an external one) it does not apply")
        if self.switch_engine == "rtl" and self.backend.startswith("ina"):
            from ..switch.rtl import rtl_params
            P = rtl_params()
            if self.window > P.window or self.elements > P.elements:
                raise ValueError(f"the RTL core takes a window of at most {P.window} and "
                                 f"at most {P.elements} elements per packet (have "
                                 f"{self.window}, {self.elements})")
        if self.switch_engine == "board" and self.backend.startswith("ina"):
            from ..switch.board import board_params
            P = board_params()
            if self.window > P.window or self.elements > P.elements:
                raise ValueError(f"the board's core takes a window of at most {P.window} "
                                 f"and at most {P.elements} elements per packet (have "
                                 f"{self.window}, {self.elements})")
        if self.static_job and not (self.switch and self.worker_base_port):
            raise ValueError("static_job needs switch and worker_base_port (the ports in "
                             "the switch's job table)")
        if self.static_job and not self.session:
            raise ValueError("static_job needs the session id of the job the switch holds "
                             "(--session: the `session` of its [[job]] table)")
        if self.switch is not None:
            host, sep, port = self.switch.rpartition(":")
            if not sep or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"bad switch address {self.switch!r}: expected ip:port")
        if self.backend.startswith("ina"):
            # the job table's own checks (window, elements, deadline), run before any
            # worker starts, so a bad value is one clear line instead of a dead worker
            from ina_fabric.protocol.jobtable import JobConfig
            JobConfig(self.job, ("127.0.0.1:1",), self.window, self.elements,
                      self.deadline_ms / 1e3 if self.deadline_ms is not None else 0.005)
        return self


@dataclass
class TrainResult:
    config: dict
    curve: list = field(default_factory=list)    # (seconds, epoch, step, test accuracy)
    time_to_accuracy: float | None = None
    final_accuracy: float = 0.0
    steps: int = 0
    seconds: float = 0.0
    stats: dict = field(default_factory=dict)     # rank 0's aggregation statistics
    param_hashes: list = field(default_factory=list)
    switch_counters: dict = field(default_factory=dict)
    switch_rtl: dict = field(default_factory=dict)    # the RTL engine's figures
    switch_board: dict = field(default_factory=dict)  # the board engine's figures
    fallbacks: int = 0
    knobs: list = field(default_factory=list)     # (seconds, step, accum, precision)
    # with a target loss: (training seconds, step, samples, test loss); training seconds
    # leave out the time spent evaluating
    loss_curve: list = field(default_factory=list)
    time_to_loss: float | None = None
    samples_to_loss: int | None = None
    params: list = field(default_factory=list)    # rank 0's final parameters (if asked)
    max_abs_grad: float = 0.0                     # largest local |gradient| of any rank
    call_seconds: list = field(default_factory=list)  # rank 0: each allreduce call's time
    rank_seconds: list = field(default_factory=list)  # each rank's wall time, in rank order
    #: bounded modes: each rank's rejoins (host.ddp.rejoin): {"rejoins", "steps_skipped",
    #: "seconds"}, in rank order (empty dicts where the run had none)
    rejoin: list = field(default_factory=list)


def load_factory(path: str):
    mod, _, name = path.partition(":")
    if not name:
        raise ValueError(f"{path!r}: expected package.module:factory")
    return getattr(importlib.import_module(mod), name)


def _params_hash(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def default_fallback(static_job: bool) -> str:
    """The fallback when neither ``--fallback`` nor INA_FALLBACK chooses: ``never`` for a
    static job, ``gloo`` otherwise. A static job names a switch that was set up by hand
    for this run (an FPGA loaded with ``ina hw-config``): a run that could not use it
    measures Gloo while its user believes it measured the board, so it stops with the
    reason. A job installed by the run itself (a switch started here, or ``--switch``
    with CONTROL) is a convenience whose absence should not lose the training: every
    rank falls back together and says so (a warning on every rank, and the table)."""
    return "never" if static_job else "gloo"


def _worker(rank, cfg_d, master_port, switch, queue, keep_params, netns=None):
    """A rank: train, or report its own error (the parent shows that one, not the
    "connection closed" its peers see next). ``netns``: the namespace to train in (the
    board engine's, where the board's TAP is)."""
    from ..oneline import quiet_child
    quiet_child()             # Ctrl-C: the parent ends the ranks, quietly
    try:
        if netns:
            from ..lab.netns import enter
            enter(netns)
        _train_rank(rank, cfg_d, master_port, switch, queue, keep_params)
    except BaseException as e:
        queue.put(("error", (rank, f"{type(e).__name__}: {e}")))
        raise SystemExit(1) from None


def _train_rank(rank, cfg_d, master_port, switch, queue, keep_params):
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from .workloads import get_workload
    from .hook import ina_hook
    cfg = TrainConfig(**cfg_d)
    torch.set_num_threads(cfg.threads)
    # master_port None: launched by torchrun (ina train --lab), rendezvous from its env
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{master_port}"
                            if master_port else "env://", rank=rank, world_size=cfg.workers)
    world = cfg.workers
    wl = get_workload(cfg.workload, cfg.seed)
    lr = cfg.lr or wl.lr
    batch = cfg.batch or wl.batch
    target = cfg.target if cfg.target is not None else wl.target
    target_loss = cfg.target_loss if cfg.target_loss is not None else \
        (wl.target_loss if cfg.target is None else None)
    model = DDP(wl.model)
    state = _hook_state(cfg, rank, world, switch)
    gloo_times = []
    if state is not None:
        model.register_comm_hook(state, ina_hook)
    elif cfg.time_gloo:
        model.register_comm_hook(gloo_times, _timed_gloo_hook)
    lr0 = scaled_lr(lr, cfg.accum_steps, cfg.lr_scaling)
    if wl.optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=lr0)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=lr0, momentum=cfg.momentum)
    lossf = torch.nn.CrossEntropyLoss()
    controller = load_factory(cfg.controller)(cfg) if (cfg.controller and rank == 0) else None
    rejoin = _rejoin(cfg, state, model, opt, rank, world)
    accum, precision = cfg.accum_steps, 32
    n_train = len(wl.y_train)

    eval_s = [0.0]

    def evaluate():
        te = time.perf_counter()
        model.eval()
        with torch.no_grad():
            out = model.module(wl.x_test)
            acc = (out.argmax(1) == wl.y_test).float().mean().item()
            test_loss = lossf(out, wl.y_test).item()
        model.train()
        eval_s[0] += time.perf_counter() - te
        return acc, test_loss

    if state is not None:
        from ..transport.quantize import warm_up
        warm_up()      # numba's kernels compiled or loaded now, not in the first epoch
    dist.barrier()
    t0 = time.perf_counter()
    step, epoch, stop = 0, 0, False
    micro = 0   # micro-steps into the current accumulation; carries across epochs
    compute_s = 0.0
    last_eval_step = 0
    samples = 0
    last_eval_samples = 0
    evals = (evaluate, target, target_loss, eval_s)
    while not stop:
        g = torch.Generator().manual_seed(cfg.seed * 7919 + epoch)
        perm = torch.randperm(n_train, generator=g)
        shard = perm[rank::world]
        for start in range(0, len(shard) - batch + 1, batch):
            idx = shard[start:start + batch]
            tc = time.perf_counter()
            last_micro = micro + 1 >= accum
            if last_micro and cfg.straggler_ms > 0:
                time.sleep(cfg.straggler_delay(rank, step))
            if last_micro:
                loss = lossf(model(wl.x_train[idx]), wl.y_train[idx]) / accum
                try:
                    loss.backward()
                except RuntimeError as e:
                    if state is None:
                        raise
                    state.raise_error(e)
            else:
                with model.no_sync():
                    loss = lossf(model(wl.x_train[idx]), wl.y_train[idx]) / accum
                    loss.backward()
            compute_s += time.perf_counter() - tc
            micro += 1
            if not last_micro:
                continue
            opt.step()
            opt.zero_grad(set_to_none=True)
            samples += accum * batch * world
            micro = 0
            step += 1
            if rejoin is not None:     # bounded: a rank that fell behind rejoins here
                rejoin.after_step(step)
            if cfg.controller and step % cfg.control_interval == 0:
                accum, precision = _apply_knobs(
                    controller, state, opt, cfg, rank, queue, lr, t0, step, epoch, loss,
                    compute_s, eval_s[0], accum, precision, batch * world)
            if cfg.max_steps and step >= cfg.max_steps:
                stop = True
                break
            if cfg.eval_every_samples and \
                    samples - last_eval_samples >= cfg.eval_every_samples:
                last_eval_samples = samples
                stop = _eval_and_decide(evals, rank, queue, t0, epoch, step, samples, cfg)
                if stop:
                    break
            elif cfg.eval_every and step - last_eval_step >= cfg.eval_every:
                last_eval_step = step
                stop = _eval_and_decide(evals, rank, queue, t0, epoch, step, samples, cfg)
                if stop:
                    break
        epoch += 1
        if not stop and not (cfg.eval_every or cfg.eval_every_samples):
            stop = _eval_and_decide(evals, rank, queue, t0, epoch, step, samples, cfg)
        if epoch >= cfg.max_epochs:
            stop = True
    if rejoin is not None:
        rejoin.finish(step)
    seconds = time.perf_counter() - t0
    final, _ = evaluate()
    out = _rank_result(rank, model, state, step, seconds, final, gloo_times, rejoin)
    if keep_params and rank == 0:
        out["params"] = [p.detach().numpy().copy() for p in model.module.parameters()]
    queue.put(("done", out))
    dist.barrier()
    if state is not None:   # after the barrier: every rank is done with the job, so
        state.close()       # rank 0 may remove it from the switch
    dist.destroy_process_group()


def _hook_state(cfg, rank, world, switch):
    """The comm hook's state for ``cfg.backend``: a switch job (set up from the
    environment and ``cfg``), another collective (a ``module:factory``), or None (Gloo)."""
    from .hook import InaHookState, setup_hook_state
    if cfg.backend in INA_BACKENDS:
        return setup_hook_state(
            switch=switch, job=cfg.job,
            mode=INA_BACKENDS[cfg.backend][0], carry=INA_BACKENDS[cfg.backend][1],
            window=cfg.window, elements=cfg.elements,
            deadline="auto" if cfg.deadline_ms is None else cfg.deadline_ms / 1e3,
            deadline_rule=cfg.deadline_rule,
            impairment=cfg.uplink(rank), configure=not cfg.static_job,
            fallback_to_gloo=cfg.resolved_fallback() == "gloo",
            bind_port=cfg.worker_base_port or None, session=cfg.session or None,
            # the simulated board runs thousands of times slower than real time
            **({"connect_timeout": 60.0, "status_timeout": 60.0}
               if cfg.switch_engine == "board" else {}))
    if cfg.backend != "gloo":
        return InaHookState(load_factory(cfg.backend)(rank, world, cfg), None)
    return None


def _apply_knobs(controller, state, opt, cfg, rank, queue, lr, t0, step, epoch, loss,
                 compute_s, eval_seconds, accum, precision, global_batch):
    """Every ``control_interval`` steps: rank 0's controller picks the knobs, every rank
    takes them (accumulation, precision, pace). Returns the new (accum, precision)."""
    import torch
    import torch.distributed as dist
    knobs = [None]
    if rank == 0:
        now = time.perf_counter() - t0
        info = {"step": step, "epoch": epoch, "time": now,
                "train_seconds": now - eval_seconds,
                "loss": float(loss.item()) * accum,
                "comm_seconds": state.comm_seconds if state else 0.0,
                "compute_seconds": compute_s,
                "bytes": state.bytes_sent if state else 0,
                "accum_steps": accum, "precision_bits": precision,
                "batch": global_batch}
        knobs = [controller.on_step(info) or {}]
    # one broadcast of three integers (-1: keep; the pace in thousandths),
    # not broadcast_object_list's two (size, then pickle): each is a trip
    # through the links' queues
    k = knobs[0] or {}
    word = torch.tensor([int(k.get("accum_steps", -1)),
                         int(k.get("precision_bits", -1)),
                         int(round(1000 * k["pace"])) if "pace" in k else -1],
                        dtype=torch.int64) \
        if rank == 0 else torch.empty(3, dtype=torch.int64)
    dist.broadcast(word, src=0)
    if word[0] > 0:
        accum = int(word[0])
    for group in opt.param_groups:
        group["lr"] = scaled_lr(lr, accum, cfg.lr_scaling)
    if word[1] > 0:
        precision = int(word[1])
    if state is not None and hasattr(state.collective, "set_precision"):
        state.collective.set_precision(precision)
    if word[2] > 0 and state is not None and hasattr(state.collective, "set_pace"):
        state.collective.set_pace(int(word[2]) / 1000.0)
    if rank == 0:
        queue.put(("knobs", (time.perf_counter() - t0, step, accum, precision)))
    return accum, precision


def _rank_result(rank, model, state, step, seconds, final, gloo_times,
                 rejoin=None) -> dict:
    """What one rank reports at the end of its run."""
    out = {"rank": rank, "hash": _params_hash(model.module), "steps": step,
           "seconds": seconds, "final": final,
           "stats": ({**state.extra_stats, **state.stats.as_dict(),
                      # (call, seconds) at every move of the derived slot deadline
                      **({"deadline_moves": [[int(c), float(d)] for c, d in
                                             state.deadline_history]}
                         if state.deadline_history else {})}
                     if state is not None else {}),
           "fallbacks": int(state is not None and not state.use_switch),
           "rejoin": ({"rejoins": rejoin.rejoins, "steps_skipped": rejoin.steps_skipped,
                       "seconds": rejoin.seconds} if rejoin is not None else {}),
           "call_seconds": state.call_seconds if state is not None else gloo_times,
           "max_abs_local": state.max_abs_local if state is not None else 0.0}
    return out


def _rejoin(cfg, state, model, opt, rank, world):
    """Bounded modes with more than one rank: a rank that falls more than a window
    behind rejoins from a peer's replica (``host.ddp.rejoin``) instead of ending the
    job; INA_REJOIN_S is its give-up time (0: no rejoin, the job ends as before)."""
    if state is None or cfg.backend not in INA_BACKENDS or world < 2 or \
            INA_BACKENDS[cfg.backend][0] == "reliable" or not state.use_switch:
        return None
    import torch.distributed as dist
    from .rejoin import Rejoin, REJOIN_GIVEUP_S
    giveup = float(os.environ.get("INA_REJOIN_S", REJOIN_GIVEUP_S))
    if giveup <= 0:
        return None
    state.rejoin = True
    state.collective.end_on_too_late = False
    return Rejoin(dist.distributed_c10d._get_default_store(), rank, world, state, model,
                  opt, giveup)


def _timed_gloo_hook(times, bucket):
    """Gloo's own allreduce (as DDP's default, averaged), timed from the bucket being
    ready to the sum being in: what ``call_seconds`` holds for the other backends."""
    import torch.distributed as dist
    t = time.perf_counter()
    buf = bucket.buffer()
    buf.div_(dist.get_world_size())
    fut = dist.all_reduce(buf, async_op=True).get_future()

    def done(f):
        times.append(time.perf_counter() - t)
        return f.value()[0]
    return fut.then(done)


def _eval_and_decide(evals, rank, queue, t0, epoch, step, samples, cfg):
    import torch
    import torch.distributed as dist
    evaluate, target, target_loss, eval_s = evals
    flag = torch.tensor([0], dtype=torch.int32)
    if rank == 0:
        acc, test_loss = evaluate()
        now = time.perf_counter() - t0
        queue.put(("eval", (now, epoch, step, acc)))
        if target_loss is not None:
            reached = test_loss <= target_loss
            queue.put(("loss", (now - eval_s[0], step, samples, test_loss, reached)))
        else:
            reached = acc >= target
        flag[0] = int(cfg.stop_at_target and reached)
    if not cfg.stop_at_target:
        # nothing to decide: no broadcast, so an evaluation is not a synchronisation
        # point that every backend pays over Gloo (under background TCP on the lab one
        # such broadcast took as long as an allreduce)
        return False
    dist.broadcast(flag, src=0)
    return bool(flag.item())


def run_training(cfg: TrainConfig, progress=None, keep_params=False, timeout=1800):
    """Start the switch (for ina backends, unless ``cfg.switch``) and ``cfg.workers``
    worker processes; return a ``TrainResult``. ``progress(kind, payload)`` is called
    with ("eval", (seconds, epoch, step, acc)) and ("knobs", ...) as they happen."""
    import multiprocessing as mp
    import torch  # noqa: F401  imported once here, inherited by the forked workers
    import sklearn.datasets  # noqa: F401
    cfg.validate()
    if cfg.backend != "gloo":
        from ..transport.quantize import warm_up
        warm_up()      # JIT once here, before any timer; the forked ranks inherit it
    # fork: the parent has run no torch op (no thread pools yet), and children inherit
    # the imports instead of paying for them four times over on two cores
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    switch_proc = None
    switch = None
    board = None
    if cfg.backend in INA_BACKENDS:
        if cfg.switch:
            host, _, port = cfg.switch.rpartition(":")
            switch = (host, int(port))
        elif cfg.switch_engine == "board":
            from ..switch.board import BoardNet
            from ..switch.keys import switch_key
            board = BoardNet(switch_key(create=True))
            switch = board.switch
        else:
            from ..cluster import start_switch_process
            switch, switch_proc = start_switch_process(ctx, engine=cfg.switch_engine)
    from ..cluster import free_tcp_port
    port = free_tcp_port()
    procs = [ctx.Process(target=_worker, args=(r, asdict(cfg), port, switch, queue,
                                               keep_params, board and board.netns),
                         daemon=True, name=f"ina-rank-{r}")
             for r in range(cfg.workers)]
    try:
        for p in procs:
            p.start()
    except BaseException:
        if board is not None:
            board.close()
        raise
    result = TrainResult(config=asdict(cfg))
    done = []

    def dead():
        bad = [p for p in procs if p.exitcode not in (None, 0)]
        if switch_proc is not None and switch_proc.exitcode is not None:
            return (f"the {cfg.switch_engine} switch exited with status "
                    f"{switch_proc.exitcode} (its reason is on stderr above)")
        if board is not None and board.proc is not None and board.proc.exitcode is not None:
            return f"the board exited with status {board.proc.exitcode}"
        return f"worker exited with status {bad[0].exitcode}" if bad else None

    try:
        _collect(queue.get, dead, cfg, result, done, progress, timeout)
        if switch_proc is not None:
            for p in procs:   # the switch's counters once every rank has closed (rank
                p.join(timeout=10)   # 0 removes the job after the final barrier)
            from ina_fabric.protocol.control_client import query_status
            try:
                st = query_status(switch)
                result.switch_counters = {k: v for k, v in st["counters"].items() if v}
                result.switch_rtl = st.get("rtl", {})
            except OSError:
                pass
    except BaseException:
        for p in procs:       # one rank failed: the others will not finish by themselves
            p.terminate()
        raise
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
        if switch_proc is not None:
            switch_proc.terminate()
            switch_proc.join(timeout=5)
        if board is not None:
            board.close()
            result.switch_board = board.stats or {}
            result.switch_counters = dict((board.stats or {}).get("core", {}))
    return _finish(result, done)


def _collect(get, dead, cfg, result, done, progress, timeout):
    """Events from the ranks until every rank is done: ("eval", (seconds, epoch, step,
    acc)) from rank 0, ("knobs", ...), ("done", summary) from each rank. ``get(timeout=)``
    returns the next event or raises; ``dead()`` names a failed rank or returns None."""
    deadline = time.monotonic() + timeout
    while len(done) < cfg.workers:
        try:
            kind, payload = get(timeout=1.0)
        except Exception:
            why = dead()
            if why:
                raise RuntimeError(why)
            if time.monotonic() > deadline:
                raise TimeoutError(f"training did not finish within {timeout}s")
            continue
        if kind == "error":             # a rank's own error, before its peers' noise
            r, msg = payload
            raise RuntimeError(f"rank {r}: {msg}")
        if kind == "eval":
            payload = tuple(payload)
            result.curve.append(payload)
            t, _, _, acc = payload
            target = cfg.target
            if target is None:
                from .workloads import TARGETS
                target = TARGETS.get(cfg.workload, 1.0)
            if result.time_to_accuracy is None and acc >= target:
                result.time_to_accuracy = t
        elif kind == "loss":
            t, step, samples, loss, reached = payload
            result.loss_curve.append((t, step, samples, loss))
            if result.time_to_loss is None and reached:
                result.time_to_loss, result.samples_to_loss = t, samples
        elif kind == "knobs":
            result.knobs.append(tuple(payload))
        elif kind == "done":
            done.append(payload)
        if progress is not None:
            progress(kind, payload)


def _finish(result, done):
    done.sort(key=lambda d: d["rank"])
    r0 = done[0]
    result.final_accuracy = r0["final"]
    result.steps = r0["steps"]
    result.seconds = r0["seconds"]
    result.rank_seconds = [d["seconds"] for d in done]
    result.rejoin = [d.get("rejoin", {}) for d in done]
    result.stats = r0["stats"]
    result.param_hashes = [d["hash"] for d in done]
    result.fallbacks = sum(d["fallbacks"] for d in done)
    result.params = r0.get("params", [])
    result.max_abs_grad = max(d["max_abs_local"] for d in done)
    result.call_seconds = list(r0.get("call_seconds", []))
    return result


def _fabric_job(cfg: TrainConfig, lab, hosts):
    """On a fabric lab (``lab.topo.spine``): ``(cfg, switch, {host: its environment})``. With
    the tree mechanism and an ``ina`` backend, the job is installed on the tree here, from
    inside the lab (each rank a member of its rack's switch, rank r on port 20000 + r, a
    fresh session; a bounded job's deadline derived from the host links as the hook
    derives it, fixed for the run; the spine's twice that) and the ranks take it as a
    static job, each with INA_WORKER its id at its rack's switch; otherwise (Gloo) a single switch at the spine, installed by rank 0."""
    from dataclasses import replace
    from ..lab import fabric as F
    from ..lab.lab import SWITCH_PORT
    spine = (lab.address(lab.topo.spine), SWITCH_PORT)
    if cfg.backend not in INA_BACKENDS:
        return cfg, spine, {}
    from ina_fabric.protocol.fields import HEADER_BYTES
    from ina_fabric.protocol.jobtable import job_defaults, new_session
    from ..deadline import slot_deadline
    mode = INA_BACKENDS[cfg.backend][0]
    s = job_defaults("ethernet", elements=cfg.elements, window=cfg.window, mode=mode,
                     deadline=None if cfg.deadline_ms is None else cfg.deadline_ms / 1e3)
    if mode != "reliable" and cfg.deadline_ms is None:
        s = replace(s, deadline=slot_deadline(s.window, HEADER_BYTES + 4 * s.elements,
                                              min(h.link.rate for h in lab.topo.hosts)))
    base, session = 20000, new_session()
    members = [f"{lab.address(h)}:{base + r}" for r, h in enumerate(hosts)]
    roles = F.install_in_lab(lab, "tree", cfg.job, s, session, members)
    cfg = replace(cfg, static_job=True, worker_base_port=base, session=session,
                  switch=f"{spine[0]}:{spine[1]}", deadline_ms=s.deadline * 1e3)
    return cfg, spine, {h: {"INA_SWITCH": r["switch"], "INA_WORKER": str(r["worker"])}
                        for h, r in zip(hosts, roles)}


def run_training_lab(cfg: TrainConfig, lab, progress=None, timeout=1800, port=29400):
    """The same training, one ``torchrun`` per host namespace of ``lab`` (multi-node:
    ``--nnodes N --node_rank i``, rendezvous on the first host over the lab network, Gloo
    on each host's ``eth0``), gradients through the lab's switch (started by the caller:
    ``lab.start_switch()``; a fabric's: ``lab.start_fabric()``, see ``_fabric_job``).
    Ranks report on their stdout as JSON lines."""
    cfg.validate()
    hosts = lab.hosts[:cfg.workers]
    if len(hosts) < cfg.workers:
        raise ValueError(f"{cfg.workers} workers but the lab has {len(lab.hosts)} hosts")
    switch = lab.switch_address
    per_host = {}                  # a fabric's tree: each host's rack switch, its id there
    if lab.topo.spine:
        cfg, switch, per_host = _fabric_job(cfg, lab, hosts)
    try:
        return _run_lab(cfg, lab, hosts, switch, per_host, progress, timeout, port)
    finally:
        if per_host:               # the tree job this run installed: the id free at once
            from ..lab import fabric as F
            try:
                F.remove_in_lab(lab, "tree", cfg.job, cfg.session,
                                [f"{lab.address(h)}:{cfg.worker_base_port + r}"
                                 for r, h in enumerate(hosts)])
            except Exception as e:  # noqa: BLE001 (a clean-up: the switch reclaims it idle)
                import warnings
                warnings.warn(f"could not remove the tree job: {e}", RuntimeWarning)


def _run_lab(cfg, lab, hosts, switch, per_host, progress, timeout, port):
    import json
    import queue as Q
    import subprocess
    import sys
    import threading
    events = Q.Queue()
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1",
           "INA_SWITCH": f"{switch[0]}:{switch[1]}",
           # the hosts' link rate: the derived slot deadline's (bounded mode, auto)
           "INA_LINK_RATE": str(min(h.link.rate for h in lab.topo.hosts))}
    procs, logs = [], []
    master = lab.address(hosts[0])

    def pump(stream):
        for line in stream:
            if line.startswith('["'):
                events.put(json.loads(line))

    for i, h in enumerate(hosts):
        log = open(lab.state_dir / f"train-{h}.log", "w+")
        p = lab.popen(h, [sys.executable, "-m", "torch.distributed.run", "--nnodes",
                          cfg.workers, "--node-rank", i, "--nproc-per-node", 1,
                          "--master-addr", master, "--master-port", port, "-m",
                          "ina_fabric.host.ddp.lab_worker", json.dumps(asdict(cfg)),
                          f"{switch[0]}:{switch[1]}"],
                      env={**env, **per_host.get(h, {})},
                      stdout=subprocess.PIPE, stderr=log, text=True)
        threading.Thread(target=pump, args=(p.stdout,), daemon=True).start()
        procs.append(p)
        logs.append(log)

    def dead():
        for h, p, log in zip(hosts, procs, logs):
            if p.poll() not in (None, 0):
                log.flush()
                log.seek(0)
                return f"torchrun in {h} exited with status {p.returncode}: " \
                       f"{log.read()[-1500:]}"
        return None

    result = TrainResult(config=asdict(cfg))
    done = []
    try:
        _collect(events.get, dead, cfg, result, done, progress, timeout)
    finally:
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait()
        for log in logs:
            log.close()
    return _finish(result, done)
