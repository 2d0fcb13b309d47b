"""The register bus of the core. The register table itself (addresses, widths,
:func:`config_writes`) is shared data in :mod:`ina_fabric.protocol.regs`, re-exported here.
"""

from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ina_fabric.protocol.regs import *  # noqa: F401,F403
from ina_fabric.protocol.regs import __all__ as _table_all

__all__ = ["RegBus"] + list(_table_all)

#: from the host's point of view (the core has ``cfg: In(RegBus)``)
RegBus = wiring.Signature({
    "addr": Out(16),
    "w_stb": Out(1),
    "w_data": Out(32),
    "r_data": In(32),
})
