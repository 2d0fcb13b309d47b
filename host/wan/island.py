"""One island's training process: what ``torchrun`` starts in each island's host.

    torchrun --standalone --nproc-per-node 1 -m ina_fabric.host.wan.island schedule PLAN.json
    torchrun --nnodes 9K --node-rank k ... -m ina_fabric.host.wan.island gloo PLAN.json

One process per host: K per island (``hosts`` in the plan; host h of island k trains on
shard k*K + h of the 9K shards, as Gloo's rank k*K + h does).

Training (both modes, the same): a 64-H-10 MLP (tanh) in PyTorch on scikit-learn's digits
(1797 images, nothing downloaded), split over the islands with the seeded Dirichlet label
skew of ``host.schedule.train`` (islands disagree, so mixing matters). Every island starts
from the same initial model. A round is ``local_steps`` SGD steps on the island's shard,
then the exchange:

* ``schedule``: the exported schedule's round (``r mod R``): install this island's edge
  jobs at the start of each run; wait for the round's start; send the update once to the
  edge replicator at the round's start + its send offset, paced at the group's rate;
  receive the aggregate of its inbound islands from its edge; average (decentralized
  averaging, ``W[i,j] = 1/(|inbound|+1)``). With K > 1 hosts per island, first the
  intra-island step: every host sends its update to the island's edge aggregator (the
  island's intra job), which returns the island's sum to every host; the island's update
  is then their mean, host 0 sends it once, and every host receives the aggregate (the
  replicator copies it to each) and mixes the same numbers: the K models stay identical.
  The WAN step starts at the round's start + the predicted intra step + ``wan_guard_s``
  (time-triggered, no second barrier).
* ``gloo``: ``torch.distributed.all_reduce`` of the parameters across every island's host
  (Gloo's ring over the same links), divided by N.

Round start (schedule mode). The optimizer's rounds are separated by a barrier that costs
nothing; here it is a time-triggered start on the machine's clock (all namespaces share
CLOCK_MONOTONIC), the stand-in for the synchronized clocks of a real deployment: each
island writes the time it is ready to a file in ``barrier_dir`` and every island starts
at the latest of them plus ``guard_s``. No datagram crosses the lab for it.

Every event is a JSON line on stdout: ``{"ev": "round", "run": .., "island": ..,
"round": r, "t_start", "t_done", "loss", "acc", ...}`` (times in seconds of
CLOCK_MONOTONIC).
"""

import hashlib
import json
import os
import pathlib
import socket
import sys
import time

import numpy as np

__all__ = ["main"]


def _emit(**kw):
    print(json.dumps(kw, default=float), flush=True)


class _Trainer:
    """The island's model, its shard, and the full training/test sets for evaluation."""

    def __init__(self, island: int, n: int, cfg: dict):
        import torch
        from ina_fabric.host.schedule.train import load_data, dirichlet_shards
        torch.set_num_threads(1)
        self.torch = torch
        self.cfg = cfg
        xtr, ytr, xte, yte = load_data(cfg["seed"])
        rng = np.random.default_rng(cfg["seed"])
        shard = dirichlet_shards(ytr, n, cfg["alpha"], rng)[island]
        self.x_tr, self.y_tr = torch.tensor(xtr, dtype=torch.float32), torch.tensor(ytr)
        self.x_te, self.y_te = torch.tensor(xte, dtype=torch.float32), torch.tensor(yte)
        self.x, self.y = self.x_tr[shard], self.y_tr[shard]
        self.island = island
        self.reset()

    def reset(self):
        torch = self.torch
        torch.manual_seed(self.cfg["seed"])        # the same start on every island
        self.model = torch.nn.Sequential(torch.nn.Linear(64, self.cfg["hidden"]),
                                         torch.nn.Tanh(),
                                         torch.nn.Linear(self.cfg["hidden"], 10))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=self.cfg["lr"])
        self.gen = torch.Generator().manual_seed(self.cfg["seed"] * 1000 + self.island)

    def local_steps(self):
        torch = self.torch
        for _ in range(self.cfg["local_steps"]):
            idx = torch.randint(len(self.y), (self.cfg["batch"],), generator=self.gen)
            loss = torch.nn.functional.cross_entropy(self.model(self.x[idx]), self.y[idx])
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()

    def flat(self) -> np.ndarray:
        from torch.nn.utils import parameters_to_vector
        return parameters_to_vector(self.model.parameters()).detach().double().numpy()

    def load(self, v: np.ndarray):
        from torch.nn.utils import vector_to_parameters
        vector_to_parameters(self.torch.tensor(v, dtype=self.torch.float32),
                             self.model.parameters())

    def evaluate(self):
        torch = self.torch
        with torch.no_grad():
            loss = torch.nn.functional.cross_entropy(self.model(self.x_tr), self.y_tr)
            acc = (self.model(self.x_te).argmax(1) == self.y_te).float().mean()
        return float(loss), float(acc)


def _barrier(d: pathlib.Path, tag: str, me: str, names, guard_s: float, timeout=600.0):
    """Everyone's start time for ``tag``: the latest ready time + ``guard_s``; sleeps
    until then and returns it."""
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{tag}.{me}"
    tmp.write_text(repr(time.monotonic()))
    os.replace(tmp, d / f"{tag}.{me}")
    t_end = time.monotonic() + timeout
    while True:
        try:
            ready = [float((d / f"{tag}.{n}").read_text()) for n in names]
            break
        except (FileNotFoundError, ValueError):
            if time.monotonic() > t_end:
                raise TimeoutError(f"barrier {tag}: not every island came in {timeout}s")
            time.sleep(0.002)
    start = max(ready) + guard_s
    _sleep_until(start)
    return start


def _sleep_until(t: float):
    """Sleep until CLOCK_MONOTONIC reaches ``t`` (the last 10 ms in 2 ms steps, so a
    SCHED_FIFO caller wakes on time); returns at once if ``t`` has passed."""
    while (left := t - time.monotonic()) > 0:
        time.sleep(min(left, 0.002) if left < 0.01 else left - 0.005)


def run_schedule(plan: dict):
    from ina_fabric.protocol.control_client import send_job
    from .exchange import Quantizer, exchange, island_mean, mix, paced
    from .plan import intra_job, island_plan
    k, names = plan["island"], plan["names"]
    K, h = plan.get("hosts", 1), plan.get("host_index", 0)
    me = names[k]
    # the barrier's parties: one per host (the island's name when K = 1)
    party = me if K == 1 else f"{me}#h{h}"
    parties = names if K == 1 else [f"{n}#h{j}" for n in names for j in range(K)]
    host, port = plan["host"].rsplit(":", 1)
    edge_ip, edge_port = plan["edge"].rsplit(":", 1)
    repl_ip, repl_port = plan["replicator"].rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind((host, int(port)))
    trainer = _Trainer(k * K + h, len(names) * K, plan["train"])
    bdir = pathlib.Path(plan["barrier_dir"])
    quant = Quantizer(len(names))
    E = plan["elements"]
    for run in plan["runs"]:
        doc = json.loads(pathlib.Path(run["schedule"]).read_text())
        rounds = island_plan(doc, me, run["deadline_s"])
        intra = intra_job(doc, me, run["deadline_s"])
        intra_pred = doc["intra"]["predicted_s"] if intra is not None else 0.0
        # install this island's edge jobs (slots start afresh): host 0 does, before the go
        if h == 0:
            for cfg in [rp.edge_job for rp in rounds] + [intra]:
                if cfg is not None:
                    send_job((edge_ip, int(edge_port)), cfg, timeout=2.0)
        trainer.reset()
        # the orchestrator's go (replicators restarted with this run's table), then all
        t0 = _barrier(bdir, f"{run['name']}-go", party, parties + ["orchestrator"],
                      plan["guard_s"])
        _emit(ev="start", run=run["name"], island=me, host=h, t0=t0)
        for r in range(run["rounds"]):
            rp = rounds[r % len(rounds)]
            trainer.local_steps()
            t_ready = time.monotonic()
            own = trainer.flat()
            npk = -(-own.size // E)
            seq0 = (r // len(rounds)) * npk       # the job's c-th use, c = cycle
            with paced():          # the wait for the start too: it must not wake late
                start = _barrier(bdir, f"{run['name']}-r{r}", party, parties,
                                 plan["guard_s"])
                wan_start, intra_res, t_intra = start, None, start
                if intra is not None:
                    # the intra-island step: every host's update to the island's edge
                    # (paced at its link's rate), the island's sum back to every host
                    intra_res = exchange(sock, own, start=start, offset=0.0,
                                         rate=plan["host_rate"], send_job=intra.job,
                                         send_to=(edge_ip, int(edge_port)),
                                         edge_job=intra.job, seq0=r * npk, elements=E,
                                         quant=quant, session=doc["session"],
                                         timeout=run["timeout_s"], worker=h)
                    own = island_mean(own, intra_res, E)
                    t_intra = intra_res.t_done
                    # the WAN step's start is time-triggered, not a second barrier:
                    # the round's start + the predicted intra step + a small guard (the
                    # intra step is paced, so it ends on time); a host that is later
                    # starts at once and its lateness is recorded (late_s)
                    wan_start = start + intra_pred + plan["wan_guard_s"]
                    _sleep_until(wan_start)
                # the island's update leaves once: from host 0
                res = exchange(sock, own, start=wan_start, offset=rp.offset_s,
                               rate=rp.rate or 1.0,
                               send_job=rp.send_job if h == 0 else None,
                               send_to=(repl_ip, int(repl_port)),
                               edge_job=rp.edge_job.job if rp.edge_job is not None else None,
                               seq0=seq0, elements=E, quant=quant, session=doc["session"],
                               timeout=run["timeout_s"])
            new = mix(own, res, E)
            trainer.load(new)
            t_mixed = time.monotonic()
            loss, acc = trainer.evaluate()
            ev = dict(ev="round", run=run["name"], island=me, host=h, round=r,
                      cycle_round=rp.round, t_ready=t_ready, t_start=start,
                      t_sent=res.t_sent, t_done=res.t_done, t_mixed=t_mixed,
                      # the round's prediction: the optimizer's, plus with K > 1 the
                      # intra-island step and the WAN step's guard
                      predicted_s=rp.predicted_s + (intra_pred + plan["wan_guard_s"]
                                                    if intra is not None else 0.0),
                      wan_predicted_s=rp.predicted_s,
                      group_predicted_s=rp.group_predicted_s, offset_s=rp.offset_s,
                      inbound=len(rp.inbound), sent=res.sent, received=res.received,
                      partial=res.partial, missing=res.missing, late_s=res.late_s,
                      loss=loss, acc=acc,
                      digest=hashlib.sha1(new.astype(np.float32).tobytes()).hexdigest()[:16])
            if intra is not None:
                ev.update(t_wan_start=wan_start, t_intra_done=t_intra,
                          intra_predicted_s=intra_pred, intra_sent=intra_res.sent,
                          intra_received=intra_res.received,
                          intra_partial=intra_res.partial, intra_missing=intra_res.missing)
            _emit(**ev)
    _emit(ev="done", island=me, host=h)


def run_gloo(plan: dict):
    import torch.distributed as dist
    import torch
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    trainer = _Trainer(rank, n, plan["train"])
    for run in plan["runs"]:
        trainer.reset()
        dist.barrier()
        t0 = time.monotonic()
        _emit(ev="start", run=run["name"], island=rank, t0=t0)
        for r in range(run["rounds"]):
            trainer.local_steps()
            t_ready = time.monotonic()
            v = torch.tensor(trainer.flat(), dtype=torch.float32)
            dist.all_reduce(v)
            trainer.load((v / n).double().numpy())
            t_done = time.monotonic()
            loss, acc = trainer.evaluate()
            _emit(ev="round", run=run["name"], island=rank, round=r, t_ready=t_ready,
                  t_start=t_ready, t_done=t_done, t_mixed=t_done, loss=loss, acc=acc)
    dist.barrier()
    dist.destroy_process_group()
    _emit(ev="done", island=rank)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] not in ("schedule", "gloo"):
        print("usage: python -m ina_fabric.host.wan.island {schedule|gloo} PLAN.json",
              file=sys.stderr)
        return 2
    plan = json.loads(pathlib.Path(argv[1]).read_text())
    (run_schedule if argv[0] == "schedule" else run_gloo)(plan)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
