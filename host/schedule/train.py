"""Decentralized training of a real small model under a schedule: real gradients,
simulated wall clock.

Model: a 64-32-10 MLP (tanh, softmax cross-entropy) on scikit-learn's bundled digits
(1797 8x8 images; nothing is downloaded), split over the islands with a seeded
Dirichlet(alpha) label skew so that islands disagree and mixing matters.  All islands
train at once: parameters are one ``(n, d)`` array and every step is batched numpy.

Each round: every island takes ``local_steps`` SGD steps on its shard (DiLoCo-style
inner steps), then the models are mixed: ``X <- W_t X`` for a clique schedule, or
replaced by the exact average for an all-reduce.  The wall clock advances by
``compute_s`` plus the round's communication time from the analytic model (the
simulator checks that model within 10%) for an update of ``update_bytes`` bytes.  The
update size is that of the large model whose exchange we emulate, not of this MLP; the
MLP supplies the optimisation dynamics.  Loss is the mean over islands of each
island's own model on the full training set (no one gets credit for a model it does
not hold).
"""

from dataclasses import dataclass, field

import numpy as np

from .model import mixing_matrix

__all__ = ["IslandTrainConfig", "Trace", "train_run", "time_to_target", "load_data"]


@dataclass(frozen=True)
class IslandTrainConfig:
    rounds: int = 120
    local_steps: int = 8
    batch: int = 32
    lr: float = 0.15
    hidden: int = 32
    alpha: float = 0.5            # Dirichlet label skew (smaller = more skewed)
    compute_s: float = 0.3        # simulated compute time of the local steps per round
    seed: int = 0


@dataclass
class Trace:
    name: str
    time: np.ndarray      # simulated wall clock after each round (s)
    loss: np.ndarray      # mean island training loss after each round
    acc: np.ndarray       # mean island test accuracy after each round
    round_comm_s: float   # mean communication time per round


def load_data(seed=0):
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0 - 0.5).astype(np.float64)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(y))
    x, y = x[perm], y[perm]
    cut = int(0.8 * len(y))
    return x[:cut], y[:cut], x[cut:], y[cut:]


def dirichlet_shards(y, n, alpha, rng):
    """Split the sample indices of labels ``y`` over ``n`` parties, each class by a
    Dirichlet(``alpha``) draw (small alpha: skewed, non-IID shards)."""
    classes = np.unique(y)
    parts = [[] for _ in range(n)]
    for c in classes:
        idx = rng.permutation(np.flatnonzero(y == c))
        p = rng.dirichlet(np.full(n, alpha))
        cuts = (np.cumsum(p)[:-1] * len(idx)).astype(int)
        for i, chunk in enumerate(np.split(idx, cuts)):
            parts[i].extend(chunk.tolist())
    return [np.array(sorted(p)) for p in parts]


class _MLP:
    def __init__(self, din, hidden, dout):
        self.shapes = [(din, hidden), (hidden,), (hidden, dout), (dout,)]
        self.sizes = [int(np.prod(s)) for s in self.shapes]
        self.d = sum(self.sizes)

    def unpack(self, X):
        out, o = [], 0
        for s, z in zip(self.shapes, self.sizes):
            out.append(X[:, o:o + z].reshape((X.shape[0],) + s))
            o += z
        return out

    def init(self, n, rng):
        x = rng.normal(0, 1, (1, self.d))
        w1, b1, w2, b2 = self.unpack(x)
        w1 *= 1 / np.sqrt(self.shapes[0][0]); b1[:] = 0
        w2 *= 1 / np.sqrt(self.shapes[2][0]); b2[:] = 0
        return np.repeat(x, n, axis=0)  # a common start, as in data-parallel training

    def forward(self, X, xb):
        """xb: (n, b, din) -> hidden (n, b, h), logits (n, b, dout)."""
        w1, b1, w2, b2 = self.unpack(X)
        h = np.tanh(np.einsum("nbi,nih->nbh", xb, w1) + b1[:, None])
        return h, np.einsum("nbh,nho->nbo", h, w2) + b2[:, None]

    @staticmethod
    def _softmax(z):
        z = z - z.max(-1, keepdims=True)
        e = np.exp(z)
        return e / e.sum(-1, keepdims=True)

    def loss_grad(self, X, xb, yb):
        h, z = self.forward(X, xb)
        p = self._softmax(z)
        n, b, _ = p.shape
        g = p.copy()
        np.put_along_axis(g, yb[..., None], np.take_along_axis(g, yb[..., None], -1) - 1, -1)
        g /= b
        w1, b1, w2, b2 = self.unpack(X)
        gw2 = np.einsum("nbh,nbo->nho", h, g)
        gb2 = g.sum(1)
        gh = np.einsum("nbo,nho->nbh", g, w2) * (1 - h * h)
        gw1 = np.einsum("nbi,nbh->nih", xb, gh)
        gb1 = gh.sum(1)
        return np.concatenate([a.reshape(n, -1) for a in (gw1, gb1, gw2, gb2)], axis=1)

    def loss_acc(self, X, x, y):
        n = X.shape[0]
        _, z = self.forward(X, np.broadcast_to(x, (n,) + x.shape))
        p = self._softmax(z)
        loss = -np.log(np.maximum(p[:, np.arange(len(y)), y], 1e-12)).mean(1)
        acc = (z.argmax(-1) == y).mean(1)
        return float(loss.mean()), float(acc.mean())


def train_run(name: str, n: int, cfg: IslandTrainConfig, *, mixing=None, round_times=None,
              exact_average=False, allreduce_s: float = 0.0, data=None) -> Trace:
    """One training run.  Either a schedule (``mixing``: list of W per round of the cycle,
    ``round_times``: their communication times) or ``exact_average`` with a fixed
    ``allreduce_s`` per round."""
    xtr, ytr, xte, yte = data if data is not None else load_data(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    shards = dirichlet_shards(ytr, n, cfg.alpha, rng)
    net = _MLP(xtr.shape[1], cfg.hidden, 10)
    X = net.init(n, rng)
    sizes = np.array([len(s) for s in shards])
    t, times, losses, accs, comm = 0.0, [], [], [], []
    for r in range(cfg.rounds):
        for _ in range(cfg.local_steps):
            pick = (rng.random((n, cfg.batch)) * sizes[:, None]).astype(int)
            idx = np.stack([shards[i][pick[i]] for i in range(n)])
            X -= cfg.lr * net.loss_grad(X, xtr[idx], ytr[idx])
        if exact_average:
            X[:] = X.mean(0, keepdims=True)
            c = allreduce_s
        else:
            k = r % len(mixing)
            X = mixing[k] @ X
            c = round_times[k]
        t += cfg.compute_s + c
        comm.append(c)
        loss, acc = net.loss_acc(X, xtr, ytr)
        _, acc = net.loss_acc(X, xte, yte)
        times.append(t), losses.append(loss), accs.append(acc)
    return Trace(name, np.array(times), np.array(losses), np.array(accs), float(np.mean(comm)))


def time_to_target(trace: Trace, target: float) -> float:
    hit = np.flatnonzero(trace.loss <= target)
    return float(trace.time[hit[0]]) if len(hit) else float("inf")
