"""Host transport: the switch client (windowed UDP) and the userspace impairment layer."""

from .switch_client import (SwitchClient, AllreduceStats, SwitchUnavailable, AllreduceTimeout,
                            AllreduceTooLate)
from .impair import Impairment, ImpairedSocket

__all__ = ["SwitchClient", "AllreduceStats", "SwitchUnavailable", "AllreduceTimeout",
           "AllreduceTooLate",
           "Impairment", "ImpairedSocket"]
