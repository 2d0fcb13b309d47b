"""The experiments behind ``ina bench control`` and ``ina control``: the simulated
comparison at paper scale, the knob trace under changing contention, and the comparison
in real training. Each returns plain dicts (figures) and prints a table."""

import numpy as np

from .contention import LEVELS, background_trace
from ina_fabric.host.controller.controllers import CONTROLLERS, make_controller
from .simulate import paper_scenario, simulate

__all__ = ["LINKS", "KAPPA2", "sim_comparison", "sim_pace_comparison", "trace_figure",
           "real_comparison", "RATE_PRICE",
           "real_trace", "measure_kappa2", "TRACE_SCHEDULE", "REAL_TRACE_SCHEDULE"]

# Bottleneck capacity per worker: a datacenter link, and a thin (oversubscribed or
# cross-site) one.
LINKS = {"100G": 12.5e9, "10G": 1.25e9}
# Chunk max^2 / mean square of real gradients (`ina control kappa`: digits CNN 20-55,
# small transformer 15-20); Gaussian would be 10.9.
KAPPA2 = 30.0
# lambda for the pace comparison: holding a whole link for a second costs twice what the
# job's workers cost for it (``costmodel``); ``ina bench control --rate-price``
RATE_PRICE = 2.0
# Changing contention for the trace: (start second, background jobs).
TRACE_SCHEDULE = [(0.0, 0), (1500.0, 1), (3000.0, 4), (5000.0, 2), (6500.0, 0), (8000.0, 4)]
# The same for real runs, in seconds of training.
REAL_TRACE_SCHEDULE = [(0.0, 0), (6.0, 4), (14.0, 1), (20.0, 4), (28.0, 0)]


def _horizon(capacity):
    return 60_000.0 * 12.5e9 / capacity


def _per_level(sc, cap, levels, seed, hysteresis):
    """(level, trace, {controller: SimResult}) for each constant contention level: every
    controller on the same trace."""
    for i, level in enumerate(levels):
        trace = background_trace(cap, sc.background, [(0.0, LEVELS[level])],
                                 _horizon(cap), seed=seed + 1000 * i)
        yield level, trace, {n: simulate(make_controller(n, sc.space, hysteresis=hysteresis),
                                         sc, trace, seed=seed) for n in CONTROLLERS}


def sim_comparison(links=("100G", "10G"), levels=("light", "medium", "heavy"), seed=0,
                   hysteresis=0.05, out=print):
    """Simulated time to target (hours) per link, level and controller; ratios to Joint."""
    figures = {}
    names = list(CONTROLLERS)
    for link in links:
        cap = LINKS[link]
        sc = paper_scenario(kappa2=KAPPA2)
        sc.job = sc.job.with_(bandwidth=cap)
        out(f"\nGPT-2 Large (774M) on 8 workers, {link} bottleneck, GPT-1B background jobs;"
            " simulated hours to target (x = slower than Joint)")
        out(f"{'contention':12s}" + "".join(f"{n:>22s}" for n in names))
        for level, trace, res in _per_level(sc, cap, levels, seed, hysteresis):
            tj = res["joint"].time_to_target
            out(f"{level:12s}" + "".join(
                f"{r.time_to_target / 3600:12.2f} h {r.time_to_target / tj:6.2f}x"
                for r in res.values()))
            for n, r in res.items():
                figures[f"sim_{link}_{level}_{n}_hours"] = r.time_to_target / 3600
                figures[f"sim_{link}_{level}_{n}_over_joint"] = r.time_to_target / tj
                figures[f"sim_{link}_{level}_{n}_knob_changes"] = r.changes
            figures[f"sim_{link}_{level}_share_of_link"] = trace.mean_rate(0, tj) / cap
    return figures


def sim_pace_comparison(links=("100G", "10G"), levels=("light", "medium", "heavy"), seed=0,
                        rate_price=RATE_PRICE, paces=None, hysteresis=0.05, out=print):
    """The pace knob beside precision and accumulation, with the objective pricing the
    link share a job holds (``costmodel``: cost = time x (1 + lambda r)): simulated cost
    and time to target per controller, ratios to Joint, and the mean pace each kept."""
    from ina_fabric.host.controller.knobs import PACES, KnobSpace
    figures = {}
    names = list(CONTROLLERS)
    space = KnobSpace(paces=tuple(paces or PACES))
    for link in links:
        cap = LINKS[link]
        sc = paper_scenario(kappa2=KAPPA2, space=space)
        sc.job = sc.job.with_(bandwidth=cap, rate_price=rate_price)
        out(f"\nthe pace knob {space.paces}, lambda = {rate_price:g}, {link} bottleneck: "
            "cost to target relative to Joint (time relative to Joint; mean pace)")
        out(f"{'contention':12s}" + "".join(f"{n:>26s}" for n in names))
        for level, trace, res in _per_level(sc, cap, levels, seed, hysteresis):
            cj, tj = res["joint"].cost, res["joint"].time_to_target
            out(f"{level:12s}" + "".join(
                f"{r.cost / cj:9.2f}x ({r.time_to_target / tj:4.2f}x; "
                f"{float(np.mean(r.log['pace'])):.2f})" for r in res.values()))
            for n, r in res.items():
                key = f"pace_{link}_{level}_{n}"
                figures[f"{key}_cost_over_joint"] = r.cost / cj
                figures[f"{key}_time_over_joint"] = r.time_to_target / tj
                figures[f"{key}_mean_pace"] = float(np.mean(r.log["pace"]))
    figures["pace_rate_price"] = rate_price
    figures["pace_choices"] = list(space.paces)
    return figures


def trace_figure(path, link="10G", schedule=None, seed=0, out=print):
    """Knobs chosen against time by Joint and Decoupled under changing contention (PNG).
    The default schedule is TRACE_SCHEDULE, compressed in time for the faster 100G run."""
    if schedule is None:
        scale = 1.0 if link == "10G" else 0.4
        schedule = [(t * scale, n) for t, n in TRACE_SCHEDULE]
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cap = LINKS[link]
    sc = paper_scenario(kappa2=KAPPA2)
    sc.job = sc.job.with_(bandwidth=cap)
    trace = background_trace(cap, sc.background, schedule, _horizon(cap), seed=seed)
    runs = {n: simulate(make_controller(n, sc.space), sc, trace, seed=seed)
            for n in ("joint", "decoupled")}
    fig, ax = plt.subplots(4, 1, figsize=(9, 9), sharex=True)
    end = max(r.time_to_target for r in runs.values()) / 3600
    tt = np.linspace(0, end * 3600, 4000)
    win = 60.0
    share = [trace.mean_rate(max(t - win, 0), t + win) / cap for t in tt]
    ax[0].plot(tt / 3600, share, color="gray", lw=0.8)
    for s, n in schedule:
        if s / 3600 < end:
            ax[0].annotate(f"{n} bg", (s / 3600, 1.02), fontsize=8)
    ax[0].set_ylabel("our share\nof the link")
    ax[0].set_ylim(0, 1.15)
    styles = {"joint": dict(color="C0", lw=1.8), "decoupled": dict(color="C3", lw=1.2, ls="--")}
    for n, r in runs.items():
        L = r.log
        lab = f"{n}: target at {r.time_to_target / 3600:.2f} h"
        ax[1].step(L["t"] / 3600, L["precision"], where="post", label=lab, **styles[n])
        ax[2].step(L["t"] / 3600, L["accum"], where="post", label=n, **styles[n])
        ax[3].plot(L["t"] / 3600, L["b_noise_est"], label=f"{n} (estimate)", **styles[n])
        ax[3].plot(L["t"] / 3600, L["b_noise_true"], color="k", lw=0.6,
                   label="true" if n == "joint" else None)
    ax[1].set_ylabel("precision\n(bits)")
    ax[1].set_yticks([4, 8, 16, 32])
    ax[2].set_ylabel("accumulation\nsteps a")
    ax[2].set_yscale("log", base=2)
    ax[2].set_yticks([1, 2, 4, 8, 16], ["1", "2", "4", "8", "16"])
    ax[3].set_ylabel("B_noise\n(sequences)")
    ax[3].set_yscale("log")
    ax[3].set_ylim(10, 5000)
    ax[3].set_xlabel("simulated hours")
    ax[1].legend(fontsize=8, loc="upper right")
    ax[3].legend(fontsize=8, loc="lower right")
    fig.suptitle(f"GPT-2 Large, {link} link, background GPT-1B jobs joining and leaving")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    ratio = runs["decoupled"].time_to_target / runs["joint"].time_to_target
    out(f"\nknob trace under changing contention ({link}): decoupled / joint time to target"
        f" = {ratio:.3f}x; wrote {path}")
    return {f"trace_{link}_decoupled_over_joint": ratio,
            f"trace_{link}_joint_changes": runs["joint"].changes,
            f"trace_{link}_decoupled_changes": runs["decoupled"].changes}


def real_comparison(levels=("light", "heavy"), controllers=None, workers=4, seed=0,
                    capacity=8e6, workload="digits", out=print, plot=None):
    """Real training (``host.ddp``) with each controller under each contention level of
    the userspace-throttled link: seconds to target accuracy, ratios to Joint."""
    from .realrun import RealSpec, real_run
    controllers = controllers or list(CONTROLLERS)
    figures, runs = {}, {}
    out(f"\nreal training: {workload}, {workers} workers on loopback, link {capacity / 1e6:g}"
        " MB/s per worker (token bucket) beside background jobs; seconds to target"
        " (x = slower than Joint)")
    out(f"{'contention':12s}" + "".join(f"{n:>22s}" for n in controllers))
    for i, level in enumerate(levels):
        row = {}
        for n in controllers:
            spec = RealSpec(controller=n, capacity=capacity, schedule=[(0.0, LEVELS[level])],
                            bg_bytes=capacity / 8, bg_compute=0.2, seed=seed + i)
            r = real_run(spec, workload=workload, workers=workers, seed=seed)
            row[n] = r
            runs[(level, n)] = r
        tj = row["joint"].time_to_accuracy if "joint" in row else None
        cells = []
        for n, r in row.items():
            t = r.time_to_accuracy
            rel = (t / tj) if (t and tj) else float("nan")
            cells.append(f"{t:12.1f} s {rel:6.2f}x" if t else
                         f"{'missed, acc':>12s} {r.final_accuracy:.2f} ")
            figures[f"real_{level}_{n}_seconds"] = t if t else float("nan")
            figures[f"real_{level}_{n}_over_joint"] = rel
            figures[f"real_{level}_{n}_steps"] = r.steps
            figures[f"real_{level}_{n}_final_accuracy"] = r.final_accuracy
            figures[f"real_{level}_{n}_replicas_identical"] = len(set(r.param_hashes)) == 1
        out(f"{level:12s}" + "".join(cells))
        for n, r in row.items():
            used = _knob_shares(r)
            figures[f"real_{level}_{n}_knobs"] = used
            out(f"{'':12s}{n}: " + ", ".join(f"{k} {v:.0%}" for k, v in used.items()))
    if plot:
        _plot_real(plot, runs, levels, controllers)
        out(f"wrote {plot}")
    return figures


def _knob_shares(result):
    """Share of optimizer steps run at each knob setting, from run_training's record of
    (seconds, step, accum, precision) at each control point (knobs before the first
    record: the default fp32/a=1)."""
    from ina_fabric.host.controller.knobs import Knobs
    marks = [(0, Knobs(32, 1))] + [(step, Knobs(int(p), int(a)))
                                   for _, step, a, p in result.knobs]
    shares = {}
    for (s0, k), (s1, _) in zip(marks, marks[1:] + [(result.steps, None)]):
        if s1 > s0:
            shares[str(k)] = shares.get(str(k), 0) + (s1 - s0) / max(result.steps, 1)
    return shares


def _plot_real(path, runs, levels, controllers):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, len(levels), figsize=(5 * len(levels), 3.6), squeeze=False)
    for i, level in enumerate(levels):
        a = ax[0][i]
        for j, n in enumerate(controllers):
            r = runs[(level, n)]
            if r.curve:
                t, _, _, acc = zip(*r.curve)
                a.plot(t, acc, label=n, color=f"C{j}")
        a.axhline(0.95, color="gray", lw=0.6, ls=":")
        a.set_title(f"{level} contention")
        a.set_xlabel("seconds")
        a.set_ylabel("test accuracy")
        a.set_ylim(0.5, 1.0)
    ax[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def real_trace(path, controller="joint", workers=4, seed=0, capacity=8e6, workload="digits",
               schedule=REAL_TRACE_SCHEDULE, out=print):
    """One real training run under changing contention: measured bandwidth against the
    link share, and the knobs the controller chose (PNG)."""
    import json
    import os
    import tempfile
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from .realrun import RealSpec, real_run
    fd, log_path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        spec = RealSpec(controller=controller, capacity=capacity, schedule=schedule,
                        bg_bytes=capacity / 8, bg_compute=0.2, seed=seed, log_path=log_path)
        r = real_run(spec, workload=workload, workers=workers, seed=seed)
        with open(log_path) as f:
            log = json.load(f)
    finally:
        os.unlink(log_path)
    trace = spec.trace()
    t = np.array([e["time"] for e in log])
    end = max(t.max(), r.seconds) if len(t) else r.seconds
    tt = np.linspace(0, end, 600)
    fig, ax = plt.subplots(3, 1, figsize=(8, 6.5), sharex=True)
    share = [trace.mean_rate(max(x - 0.5, 0), x + 0.5) / 1e6 for x in tt]
    ax[0].plot(tt, share, color="gray", lw=0.8, label="link share (token bucket rate)")
    ax[0].plot(t, [e["bandwidth"] / 1e6 for e in log], "o-", ms=3, color="C0",
               label="measured by the controller")
    ax[0].set_ylabel("MB/s")
    ax[0].legend(fontsize=8)
    ax[1].step(t, [e["precision"] for e in log], where="post", color="C0")
    ax[1].set_ylabel("precision (bits)")
    ax[1].set_yticks([4, 8, 16, 32])
    ax[2].step(t, [e["accum"] for e in log], where="post", color="C0")
    ax[2].set_ylabel("accumulation a")
    ax[2].set_yscale("log", base=2)
    ax[2].set_yticks([1, 2, 4, 8], ["1", "2", "4", "8"])
    ax[2].set_xlabel("seconds of training")
    tta = r.time_to_accuracy
    fig.suptitle(f"real run: {workload}, {workers} workers, {controller}; background jobs "
                 + " -> ".join(str(n) for _, n in schedule)
                 + (f"; target at {tta:.1f} s" if tta else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    out(f"\nreal knob trace ({controller}, changing contention): "
        f"{len(log)} decisions, {sum(1 for a, b in zip(log, log[1:]) if (a['precision'], a['accum']) != (b['precision'], b['accum']))}"
        f" changes, target at {tta if tta is None else round(tta, 1)} s; wrote {path}")
    return {"real_trace_seconds": tta if tta else float("nan"),
            "real_trace_decisions": len(log)}


def measure_kappa2(workload="digits", steps=60, every=10, seed=0, out=print):
    """kappa2 = 6 L_q^2 r_q of real gradients (single process, plain SGD with momentum),
    from the exact stochastic-rounding error at int4 and int8, every ``every`` steps."""
    import torch
    from ina_fabric.host.ddp.workloads import get_workload
    from ina_fabric.host.controller.compress import relative_errors
    torch.manual_seed(seed)
    wl = get_workload(workload, seed)
    opt = torch.optim.SGD(wl.model.parameters(), lr=wl.lr, momentum=0.9)
    lossf = torch.nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(seed)
    rows = []
    for step in range(steps):
        idx = torch.randint(0, len(wl.y_train), (wl.batch,), generator=g)
        opt.zero_grad()
        lossf(wl.model(wl.x_train[idx]), wl.y_train[idx]).backward()
        if step % every == 0:
            grad = torch.cat([p.grad.ravel() for p in wl.model.parameters()]).numpy()
            r = relative_errors(grad, (8, 4))
            rows.append((step, 6 * 7 ** 2 * r[4], 6 * 127 ** 2 * r[8]))
        opt.step()
    out(f"kappa2 of {workload} gradients (Gaussian: 10.9)")
    out("step   from int4   from int8")
    for step, k4, k8 in rows:
        out(f"{step:4d} {k4:11.1f} {k8:11.1f}")
    return rows
