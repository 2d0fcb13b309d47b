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
* ``digits-mlp``: a wide multilayer perceptron on the same digits (the 8x8 images
  flattened; two hidden layers of 1,024, ReLU): 1.1M parameters, 4.5 MB of gradients per
  step, and a few milliseconds of compute per step for a rank's batch of 32. A workload
  whose step is its exchange, as in the data-parallel training of large models, where
  the time to accuracy follows the network rather than the CPU (on our 2-core machines
  the transformers' steps are their compute). Target: 95% (50-65 steps at a global batch
  of 128, SGD with momentum).
* ``charlm``: a small causal transformer (GPT-style, 2 layers, width 64, 100k parameters)
  predicting the next character of real text: the Python standard library's own source
  (a fixed list of modules; the last ones held out for test). Language modelling has a
  gradient noise scale well above a small micro-batch, which is what the accumulation
  knob needs (fitted from measured curves: 50-290 sequences, docs/control.md). The
  metric is test loss (nats per character); accuracy is next-character accuracy. Adam.
"""

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

__all__ = ["Workload", "get_workload", "WORKLOADS", "TARGETS"]

# each classification workload's default target test accuracy (the parent process of a
# run reads it here without building the workload)
TARGETS = {"digits": 0.95, "digits-mlp": 0.95, "transformer": 0.75,
           "transformer-large": 0.75}


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
    target_loss: float | None = None   # default target test loss (language models)


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
    x, y, cut = _digits_data()
    torch.manual_seed(seed)
    return Workload("digits", DigitsCNN(), x[:cut], y[:cut], x[cut:], y[cut:],
                    target=TARGETS["digits"], lr=0.05, batch=32)


def _digits_data():
    """scikit-learn's digits, scaled to [0, 1], in a fixed shuffle: 80% train, 20% test."""
    from sklearn.datasets import load_digits
    d = load_digits()
    x = torch.tensor(d.images / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(d.target, dtype=torch.long)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(1234))
    return x[perm], y[perm], int(0.8 * len(y))


def _digits_mlp(seed, width=1024):
    x, y, cut = _digits_data()
    x = x.flatten(1)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width),
                          nn.ReLU(), nn.Linear(width, 10))
    return Workload("digits-mlp", model, x[:cut], y[:cut], x[cut:], y[cut:],
                    target=TARGETS["digits-mlp"], lr=0.05, batch=32)


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


def _token_groups(n, length, vocab, classes):
    """The transformers' task, generated (fixed seed): sequences of tokens, labelled by
    which of ``classes`` token groups occurs most often; 80% train, 20% test."""
    g = torch.Generator().manual_seed(4321)
    x = torch.randint(0, vocab, (n, length), generator=g)
    y = torch.stack([(x % classes == c).sum(1) for c in range(classes)], 1).argmax(1)
    cut = int(0.8 * n)
    return x, y, cut


def _transformer(seed, n=4096, length=32, vocab=64, classes=8):
    x, y, cut = _token_groups(n, length, vocab, classes)
    torch.manual_seed(seed)
    return Workload("transformer", SeqTransformer(vocab, length=length, classes=classes),
                    x[:cut], y[:cut], x[cut:], y[cut:], target=TARGETS["transformer"],
                    lr=1e-3, batch=32,
                    optimizer="adam")


def _transformer_large(seed, n=4096, length=16, vocab=64, classes=8):
    x, y, cut = _token_groups(n, length, vocab, classes)
    torch.manual_seed(seed)
    model = SeqTransformer(vocab, d=512, layers=4, heads=8, classes=classes, length=length,
                           ffn=2048)
    return Workload("transformer-large", model, x[:cut], y[:cut], x[cut:], y[cut:],
                    target=TARGETS["transformer-large"], lr=3e-4, batch=16, optimizer="adam")


# charlm's corpus: standard-library modules present in every CPython 3.10+, in this order;
# the last CHARLM_TEST are the held-out test text.
CHARLM_FILES = ("argparse.py", "ast.py", "calendar.py", "configparser.py", "csv.py",
                "dataclasses.py", "difflib.py", "enum.py", "fractions.py", "ftplib.py",
                "gettext.py", "heapq.py", "inspect.py", "ipaddress.py", "locale.py",
                "logging/__init__.py", "mailbox.py", "optparse.py", "pathlib.py",
                "pickle.py", "pprint.py", "shutil.py", "smtplib.py", "statistics.py",
                "string.py", "subprocess.py", "tarfile.py", "textwrap.py", "threading.py",
                "typing.py", "uuid.py", "random.py",
                "tempfile.py", "weakref.py")
CHARLM_TEST = 2
CHARLM_VOCAB = 98        # tab, newline, printable ASCII 32..126, one "other"


def charlm_encode(text: str) -> np.ndarray:
    """Characters to token ids: tab 0, newline 1, ' '..'~' 2..96, other control
    characters 97; non-ASCII characters are read as '?' first."""
    b = np.frombuffer(text.encode("ascii", "replace"), np.uint8).astype(np.int64)
    out = np.full(b.shape, CHARLM_VOCAB - 1, np.int64)
    out[b == 9] = 0
    out[b == 10] = 1
    printable = (b >= 32) & (b <= 126)
    out[printable] = b[printable] - 30
    return out


class CharGPT(nn.Module):
    """Causal transformer over characters; returns logits as (batch, vocab, time), the
    layout ``CrossEntropyLoss`` takes with a (batch, time) target."""

    def __init__(self, vocab=CHARLM_VOCAB, d=64, layers=2, heads=4, length=64):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(length, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(length),
                             persistent=False)

    def forward(self, x):
        t = x.shape[1]
        h = self.encoder(self.embed(x) + self.pos[:t], mask=self.mask[:t, :t], is_causal=True)
        return self.head(self.norm(h)).transpose(1, 2)


def _charlm_corpus():
    import sysconfig
    from pathlib import Path
    root = Path(sysconfig.get_paths()["stdlib"])
    texts = [(root / f).read_text(encoding="utf-8", errors="replace") for f in CHARLM_FILES]
    return texts[:-CHARLM_TEST], texts[-CHARLM_TEST:]


def _windows(tokens, length, count=None, rng=None):
    n = (tokens.size - 1) // length
    starts = np.arange(n) * length
    if count is not None:
        starts = np.sort(rng.choice(starts, size=min(count, n), replace=False))
    idx = starts[:, None] + np.arange(length + 1)
    w = torch.from_numpy(tokens[idx])
    return w[:, :-1].contiguous(), w[:, 1:].contiguous()


def _charlm(seed, length=64, test_windows=256):
    train_txt, test_txt = _charlm_corpus()
    train = charlm_encode("\n".join(train_txt))
    test = charlm_encode("\n".join(test_txt))
    x, y = _windows(train, length)
    xt, yt = _windows(test, length, test_windows, np.random.default_rng(99))
    torch.manual_seed(seed)
    return Workload("charlm", CharGPT(length=length), x, y, xt, yt, target=0.5, lr=2e-3,
                    batch=8, optimizer="adam", target_loss=1.9)


WORKLOADS = {"digits": _digits, "digits-mlp": _digits_mlp, "transformer": _transformer,
             "transformer-large": _transformer_large, "charlm": _charlm}


def get_workload(name: str, seed: int = 0) -> Workload:
    try:
        return WORKLOADS[name](seed)
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; have {', '.join(WORKLOADS)}") from None
