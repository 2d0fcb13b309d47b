"""Training workloads on data that ships with a package or is generated: nothing is
downloaded.

* ``digits``: a small CNN on scikit-learn's 8x8 handwritten digits (1797 images; 20% held
  out for test). Target: 95% test accuracy.
* ``transformer``: a small transformer encoder classifying generated token sequences
  (the label is the most frequent token class, so it is learnable); 1.1M parameters,
  4.3 MB of gradients per step, Adam: the larger workload for benchmarks. Target: 75%.
* ``transformer-large``: the same task with a 4-layer, 512-wide encoder (feed-forward
  2,048): 12.7M parameters, 51 MB of gradients per step, sequences of 16 tokens, batch
  16: a workload where communication matters (CPU-bound on our 2-core machines: seconds
  per step). Target: 75%.
"""

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

__all__ = ["Workload", "get_workload", "WORKLOADS"]


@dataclass
class Workload:
    name: str
    model: nn.Module
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    target: float        # default target test accuracy
    lr: float
    batch: int           # per-worker batch size
    optimizer: str = "sgd"   # sgd (with the config's momentum) or adam


class DigitsCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x):
        return self.net(x)


def _digits(seed):
    from sklearn.datasets import load_digits
    d = load_digits()
    x = torch.tensor(d.images / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(d.target, dtype=torch.long)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(1234))
    x, y = x[perm], y[perm]
    cut = int(0.8 * len(y))
    torch.manual_seed(seed)
    return Workload("digits", DigitsCNN(), x[:cut], y[:cut], x[cut:], y[cut:],
                    target=0.95, lr=0.05, batch=32)


class SeqTransformer(nn.Module):
    def __init__(self, vocab=64, d=256, layers=2, heads=4, classes=8, length=32, ffn=None):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(length, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, heads, ffn or 2 * d, dropout=0.0,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        h = self.encoder(self.embed(x) + self.pos)
        return self.head(h.mean(dim=1))


def _transformer(seed, n=4096, length=32, vocab=64, classes=8):
    g = torch.Generator().manual_seed(4321)
    x = torch.randint(0, vocab, (n, length), generator=g)
    # label: which of `classes` token groups occurs most often in the sequence
    y = torch.stack([(x % classes == c).sum(1) for c in range(classes)], 1).argmax(1)
    cut = int(0.8 * n)
    torch.manual_seed(seed)
    return Workload("transformer", SeqTransformer(vocab, length=length, classes=classes),
                    x[:cut], y[:cut], x[cut:], y[cut:], target=0.75, lr=1e-3, batch=32,
                    optimizer="adam")


def _transformer_large(seed, n=4096, length=16, vocab=64, classes=8):
    g = torch.Generator().manual_seed(4321)
    x = torch.randint(0, vocab, (n, length), generator=g)
    y = torch.stack([(x % classes == c).sum(1) for c in range(classes)], 1).argmax(1)
    cut = int(0.8 * n)
    torch.manual_seed(seed)
    model = SeqTransformer(vocab, d=512, layers=4, heads=8, classes=classes, length=length,
                           ffn=2048)
    return Workload("transformer-large", model, x[:cut], y[:cut], x[cut:], y[cut:],
                    target=0.75, lr=3e-4, batch=16, optimizer="adam")


WORKLOADS = {"digits": _digits, "transformer": _transformer,
             "transformer-large": _transformer_large}


def get_workload(name: str, seed: int = 0) -> Workload:
    try:
        return WORKLOADS[name](seed)
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; have {', '.join(WORKLOADS)}") from None
