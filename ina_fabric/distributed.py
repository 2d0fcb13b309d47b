"""``import ina_fabric.distributed`` registers the ``ina`` torch.distributed backend:

    import ina_fabric.distributed
    torch.distributed.init_process_group("ina")

all_reduce then runs through the switch at INA_SWITCH (ip:port); every other collective
runs on Gloo. See ``ina_fabric.host.ddp.backend`` for the options and errors.
"""

from ina_fabric.host.ddp.backend import (BACKEND, InaOptions, ProcessGroupIna, InaWork,  # noqa: F401
                                         WorldTooLarge, JobNotInstalled, monitored_barrier,
                                         register)

__all__ = ["BACKEND", "InaOptions", "ProcessGroupIna", "InaWork", "WorldTooLarge",
           "JobNotInstalled", "monitored_barrier", "register"]
