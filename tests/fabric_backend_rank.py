"""One rank of tests/test_lab_fabric.py's `ina` backend check on the fabric's tree: DDP
on the digits CNN with ``init_process_group("ina")``, the rank a member of its rack's
switch (INA_SWITCH, INA_WORKER, a static tree job: INA_STATIC_JOB, INA_SESSION,
INA_PORT), trained until the workload's target test accuracy (or EPOCHS); prints one
JSON line: the epoch and accuracy reached, the parameters' digest, the calls the switch
made, and whether it used the switch."""

import hashlib
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

import ina_fabric.distributed  # noqa: F401  (registers the backend "ina")
from ina_fabric.host.ddp.workloads import get_workload


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("ina")
    rank, world = dist.get_rank(), dist.get_world_size()
    w = get_workload("digits", seed=0)
    model = torch.nn.parallel.DistributedDataParallel(w.model)
    opt = torch.optim.SGD(model.parameters(), lr=w.lr, momentum=0.9)
    steps = len(w.y_train) // world // w.batch
    acc, epoch = 0.0, 0
    for epoch in range(1, int(os.environ.get("EPOCHS", "20")) + 1):
        perm = torch.randperm(len(w.y_train), generator=torch.Generator().manual_seed(epoch))
        mine = perm[rank::world]
        for i in range(steps):
            idx = mine[i * w.batch:(i + 1) * w.batch]
            opt.zero_grad()
            F.cross_entropy(model(w.x_train[idx]), w.y_train[idx]).backward()
            opt.step()
        with torch.no_grad():        # identical replicas: every rank stops at one epoch
            acc = (model(w.x_test).argmax(1) == w.y_test).float().mean().item()
        if acc >= w.target:
            break
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                     for p in model.parameters())).hexdigest()
    pg = dist.distributed_c10d._get_default_group()
    print(json.dumps({"rank": rank, "epoch": epoch, "acc": acc, "target": w.target,
                      "digest": digest, "switch_calls": pg.state.stats.calls,
                      "use_switch": bool(pg.state.use_switch)}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
