"""Training progress fitted from measured curves, not assumed: the simulator's progress
model, and the noise scale the controllers use, come from real runs of the workload.

The form is the noise-scale model of McCandlish et al. 2018 (the one ``costmodel`` uses),
but every number in it is fitted. Progress is counted in units ``u`` of steps at infinite
batch; a step at global batch ``B`` and precision ``q`` while the test loss is ``l``
advances ``u`` by ``1 / (1 + B_noise(l)/B + rho_q)``, with ``rho_q`` the quantization
term of ``costmodel`` (the measured relative error ``r_q``). On a grid of losses
``l_0 > l_1 > ... > l_K`` the model holds, per interval, ``du_k`` (progress from l_{k-1}
to l_k) and ``B_k`` (the noise scale there). A run at fixed (q, a) then needs

    steps_k = du_k (1 + B_k / B + rho_q)

steps on interval k: linear in 1/B, so each interval is a least-squares fit of
``steps_k = alpha + beta / B`` over the fitting runs (float32, several B), with
``du_k = alpha`` and ``B_k = beta / alpha`` (both kept >= 0). The steps on each interval
come from each run's loss curve (test loss against optimizer steps, made monotone by a
running minimum, interpolated at the grid losses).

``check`` replays held-out runs (other precisions, batches, seeds, and runs whose knobs
changed during training) through the model step by step and reports the relative error
of the predicted samples to the target loss.
"""

from dataclasses import dataclass, field

import numpy as np

__all__ = ["ProgressModel", "steps_at_losses", "fit", "predict_steps"]


def steps_at_losses(curve, losses):
    """Optimizer steps at which a run's test loss first reaches each of ``losses``
    (descending), linearly interpolated on the running minimum of the curve;
    NaN where never reached. ``curve``: [(step, loss)] with the start (0, initial loss)."""
    c = np.asarray(curve, float)
    steps, loss = c[:, 0], np.minimum.accumulate(c[:, 1])
    out = np.full(len(losses), np.nan)
    for i, level in enumerate(losses):
        hit = np.nonzero(loss <= level)[0]
        if hit.size == 0:
            continue
        j = hit[0]
        if j == 0:
            out[i] = steps[0]
            continue
        l0, l1 = loss[j - 1], loss[j]
        f = (l0 - level) / (l0 - l1) if l0 > l1 else 1.0
        out[i] = steps[j - 1] + f * (steps[j] - steps[j - 1])
    return out


@dataclass
class ProgressModel:
    losses: np.ndarray                  # l_0 > l_1 > ... > l_K
    du: np.ndarray                      # K: progress per interval (steps at B = inf)
    b_noise: np.ndarray                 # K: noise scale per interval (samples)
    workers: int
    micro_batch: int
    quant_ratio: dict = field(default_factory=dict)   # precision -> r_q

    def rho(self, precision, accum, k):
        r = self.quant_ratio.get(int(precision), 0.0)
        return r / self.workers * (1.0 + self.b_noise[k] / (accum * self.micro_batch))

    def interval(self, u):
        """The interval index at progress ``u`` (K when past the last grid loss)."""
        return int(np.searchsorted(np.cumsum(self.du), u, side="right"))

    def loss_at(self, u):
        cum = np.concatenate([[0.0], np.cumsum(self.du)])
        return float(np.interp(u, cum, self.losses))

    def b_noise_at_loss(self, loss):
        """Noise scale at this loss (the interval it falls in; clamped at the ends)."""
        k = int(np.searchsorted(-self.losses, -loss, side="left")) - 1
        return float(self.b_noise[min(max(k, 0), len(self.b_noise) - 1)])

    def step_progress(self, u, precision, accum):
        k = min(self.interval(u), len(self.du) - 1)
        B = accum * self.micro_batch * self.workers
        return 1.0 / (1.0 + self.b_noise[k] / B + self.rho(precision, accum, k))

    def total(self, target_loss):
        cum = np.concatenate([[0.0], np.cumsum(self.du)])
        return float(np.interp(-target_loss, -self.losses, cum))

    def to_dict(self):
        return {"losses": self.losses.tolist(), "du": self.du.tolist(),
                "b_noise": self.b_noise.tolist(), "workers": self.workers,
                "micro_batch": self.micro_batch,
                "quant_ratio": {str(k): v for k, v in self.quant_ratio.items()}}

    @classmethod
    def from_dict(cls, d):
        return cls(np.asarray(d["losses"]), np.asarray(d["du"]), np.asarray(d["b_noise"]),
                   int(d["workers"]), int(d["micro_batch"]),
                   {int(k): float(v) for k, v in d.get("quant_ratio", {}).items()})


def fit(runs, losses, workers, micro_batch, quant_ratio=None) -> ProgressModel:
    """Fit from fixed-knob runs: ``runs`` = [(precision, accum, [(step, loss)])]. Only
    float32 runs enter the fit of du and B_noise (the quantization term comes from the
    measured r_q); every interval needs at least two batch sizes."""
    losses = np.asarray(losses, float)
    K = len(losses) - 1
    rows = []
    for q, a, curve in runs:
        if q != 32:
            continue
        s = steps_at_losses(curve, losses)
        rows.append((a * micro_batch * workers, np.diff(s)))
    if len(rows) < 2:
        raise ValueError("progress fit needs float32 runs at two or more batch sizes")
    du, bn = np.zeros(K), np.zeros(K)
    for k in range(K):
        x = np.array([1.0 / B for B, d in rows if np.isfinite(d[k])])
        y = np.array([d[k] for B, d in rows if np.isfinite(d[k])])
        if x.size < 2 or np.ptp(x) == 0:
            raise ValueError(f"progress fit: interval {losses[k]:.3f} -> {losses[k + 1]:.3f}"
                             " reached by fewer than two batch sizes")
        beta, alpha = np.polyfit(x, y, 1)
        if alpha <= 0:        # a noisy interval: keep a little progress, the rest is noise
            alpha = 0.1 * float(y.min())
            beta = float(np.mean((y - alpha) / x))
        du[k] = alpha
        bn[k] = max(beta, 0.0) / alpha
    return ProgressModel(losses, du, bn, workers, micro_batch, dict(quant_ratio or {}))


def predict_steps(model: ProgressModel, knobs_by_step, target_loss, max_steps=100_000):
    """Steps and samples the model predicts to reach ``target_loss`` when the knobs follow
    ``knobs_by_step`` [(from step, precision, accum)] (the last holds; of two marks at
    the same step, the later one)."""
    goal = model.total(target_loss)
    marks = sorted(knobs_by_step, key=lambda m: m[0])   # stable: a later mark wins
    u, step, samples, i = 0.0, 0, 0, 0
    while u < goal and step < max_steps:
        while i + 1 < len(marks) and marks[i + 1][0] <= step:
            i += 1
        _, q, a = marks[i]
        u += model.step_progress(u, q, a)
        step += 1
        samples += a * model.micro_batch * model.workers
    return step, samples
