"""The software switch: the reference model (``model``, *the* definition of the
aggregator semantics) and its UDP server (``server``, what ``ina switch`` runs)."""

from .model import SwitchModel, COUNTERS, INT32_MIN, INT32_MAX, GROUP_WORKER
from .server import SwitchServer
# the control-plane client lives beside the auth rule; re-exported for callers of old
from ina_fabric.protocol.control_client import query_status, send_job, remove_job, JobRefused

__all__ = ["SwitchModel", "COUNTERS", "INT32_MIN", "INT32_MAX", "GROUP_WORKER",
           "SwitchServer", "query_status", "send_job", "remove_job", "JobRefused"]
