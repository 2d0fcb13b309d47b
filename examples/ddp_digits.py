"""A plain PyTorch DDP training script (scikit-learn's handwritten digits, a small CNN)
that aggregates its gradients in the network by changing one line:

    torchrun --nproc-per-node 4 examples/ddp_digits.py              # backend "ina"
    torchrun --nproc-per-node 4 examples/ddp_digits.py --backend gloo

with a switch running (``ina switch --listen 127.0.0.1:19900``) and INA_SWITCH=ip:port in
the environment. The lines that matter are marked ``# INA``; the rest is what any DDP
script has. ``ddp_digits_hook.py`` is the same script with the DDP comm hook instead.
"""

import argparse
import hashlib
import json
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ina_fabric.distributed  # noqa: F401                # INA: registers backend "ina"


def digits(seed=1234):
    """The digits, scaled to [0, 1]; 80% train, 20% test (the same split on every rank)."""
    from sklearn.datasets import load_digits
    d = load_digits()
    x = torch.tensor(d.images / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(d.target, dtype=torch.long)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    x, y = x[perm], y[perm]
    cut = int(0.8 * len(y))
    return x[:cut], y[:cut], x[cut:], y[cut:]


def make_model():
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))


def parse(argv=None, backend="ina"):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default=backend, help="torch.distributed backend")
    ap.add_argument("--target", type=float, default=0.95, help="test accuracy to stop at")
    ap.add_argument("--max-epochs", type=int, default=30)
    ap.add_argument("--batch", type=int, default=32, help="per rank")
    ap.add_argument("--accum", type=int, default=1, help="micro-batches per step")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--out", help="write this rank's result (JSON) to OUT.rank<r>.json")
    return ap.parse_args(argv)


def main(argv=None, backend="ina", wrap=None):
    args = parse(argv, backend)
    dist.init_process_group(args.backend)                    # INA: was "gloo"
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    x_train, y_train, x_test, y_test = digits()
    model = DDP(make_model())
    if wrap is not None:
        wrap(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    lossf = nn.CrossEntropyLoss()
    step, acc, epoch = 0, 0.0, 0
    for epoch in range(1, args.max_epochs + 1):
        perm = torch.randperm(len(y_train), generator=torch.Generator().manual_seed(epoch))
        shard = perm[rank::world]
        starts = list(range(0, len(shard) - args.batch + 1, args.batch))
        for i, start in enumerate(starts):
            idx = shard[start:start + args.batch]
            last = (i + 1) % args.accum == 0 or i + 1 == len(starts)
            if last:
                (lossf(model(x_train[idx]), y_train[idx]) / args.accum).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                step += 1
            else:
                with model.no_sync():      # gradient accumulation: no allreduce
                    (lossf(model(x_train[idx]), y_train[idx]) / args.accum).backward()
        model.eval()
        with torch.no_grad():
            acc = (model(x_test).argmax(1) == y_test).float().mean().item()
        model.train()
        # every rank evaluates the same model; agree anyway (a plain all_reduce, MAX)
        stop = torch.tensor([float(acc >= args.target)])
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if rank == 0:
            print(f"epoch {epoch} step {step} test accuracy {acc:.3f}", flush=True)
        if stop.item():
            break
    if args.out:
        h = hashlib.sha256()
        for p in model.module.parameters():
            h.update(p.detach().numpy().tobytes())
        with open(f"{args.out}.rank{rank}.json", "w") as f:
            json.dump({"rank": rank, "accuracy": acc, "steps": step, "epochs": epoch,
                       "params_sha256": h.hexdigest(), "backend": dist.get_backend()}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
