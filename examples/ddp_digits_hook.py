"""The same DDP script as ``ddp_digits.py``, with the process group left on Gloo and the
gradients sent through the switch by the DDP comm hook instead of the backend:

    torchrun --nproc-per-node 4 examples/ddp_digits_hook.py

The two lines that differ are marked ``# INA``. The hook averages; it falls back to Gloo
(with a warning) when no switch answers, where the backend raises unless INA_FALLBACK=gloo.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ddp_digits import main  # noqa: E402
from ina_fabric.host.ddp.hook import InaHookState, ina_hook  # noqa: E402    # INA


def use_hook(model):
    model.register_comm_hook(InaHookState.from_env(), ina_hook)              # INA


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(backend="gloo", wrap=use_hook)
