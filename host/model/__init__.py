"""The reference switch model: the one definition of the aggregator semantics."""

from .switch_model import SwitchModel, COUNTERS, INT32_MIN, INT32_MAX, GROUP_WORKER

__all__ = ["SwitchModel", "COUNTERS", "INT32_MIN", "INT32_MAX", "GROUP_WORKER"]
