"""PNG figures: the round diagram on a map, the memory sweep, loss against wall time."""

import numpy as np

__all__ = ["plot_rounds", "plot_sweep", "plot_training"]


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_rounds(topo, cand, path):
    plt = _plt()
    R = len(cand.schedule.rounds)
    cols = min(R, 4)
    rows = -(-R // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 2.6 * rows), squeeze=False)
    lon, lat = topo.lon, topo.lat
    colors = plt.get_cmap("tab10")
    for r, rnd in enumerate(cand.schedule.rounds):
        ax = axes[r // cols][r % cols]
        ax.scatter(lon, lat, s=12, c="k", zorder=3)
        for g, comp in enumerate(rnd.components()):
            for i in comp:
                for j in rnd.inbound[i]:
                    ax.plot([lon[j], lon[i]], [lat[j], lat[i]], color=colors(g % 10), lw=1.2)
        if topo.n <= 16:
            for i, nm in enumerate(topo.names):
                ax.annotate(nm, (lon[i], lat[i]), fontsize=6, xytext=(2, 2),
                            textcoords="offset points")
        ax.set_title(f"round {r + 1}: {1e3 * cand.round_times[r]:.0f} ms", fontsize=8)
        ax.set_xlim(-180, 180), ax.set_ylim(-60, 75)
        ax.tick_params(labelsize=6)
    for k in range(R, rows * cols):
        axes[k // cols][k % cols].axis("off")
    fig.suptitle(f"{cand.family} k={cand.k}: cycle {1e3 * cand.t_cycle:.0f} ms, "
                 f"sigma2 {cand.sigma2:.3g}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_sweep(rows, path):
    """rows: dicts with memory_bytes, best_k, and objective per family label."""
    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.4))
    m = np.array([r["memory_bytes"] for r in rows])
    labels = [k for k in rows[0]["per_family"]]
    for lab in labels:
        a1.plot(m, [r["per_family"][lab] for r in rows], marker=".", label=lab)
    a1.set_xscale("log"), a1.set_yscale("symlog", linthresh=0.1)
    a1.set_xlabel("FPGA memory M (bytes)"), a1.set_ylabel("-log sigma2 / T_cycle (1/s)")
    a1.legend(fontsize=6)
    a2.step(m, [r["best_k"] for r in rows], where="mid")
    a2.set_xscale("log"), a2.set_xlabel("FPGA memory M (bytes)")
    a2.set_ylabel("clique size of the best schedule")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_training(traces, target, path):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for tr in traces:
        ax.plot(tr.time, tr.loss, label=tr.name)
    ax.axhline(target, color="k", ls=":", lw=0.8, label="target loss")
    ax.set_xscale("log"), ax.set_yscale("log")
    ax.set_xlabel("simulated wall clock (s)"), ax.set_ylabel("training loss (mean over islands)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
