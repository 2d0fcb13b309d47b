"""One rank of ``ina train --lab``: what ``torchrun`` starts in each host namespace.

    torchrun --nnodes N --node-rank i --nproc-per-node 1 --master-addr H0 --master-port P \\
        -m ina_fabric.host.ddp.lab_worker CONFIG_JSON SWITCH_IP:PORT

It runs the same training loop as the local cluster (``host.ddp.train._worker``), with
the rendezvous from torchrun's environment, and reports its events (evaluations, the
final summary) on stdout as JSON lines for ``run_training_lab`` to read.
"""

import json
import os
import sys


class _Lines:
    """The event queue of ``_worker``, as JSON lines on stdout."""

    def put(self, item):
        kind, payload = item
        print(json.dumps([kind, payload], default=float), flush=True)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    cfg_d, switch = json.loads(argv[0]), argv[1]
    host, _, port = switch.rpartition(":")
    from .train import _worker
    _worker(int(os.environ["RANK"]), cfg_d, None, (host, int(port)), _Lines(), False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
