"""``struct`` view of the wire format: one header parsed into a tuple of ints with a single
``unpack_from`` call (no numpy scalars), the form the per-datagram paths use.

``HEADER_STRUCT.unpack_from(buf)`` returns the fields of :data:`HEADER_FIELDS` in wire
order; ``H_<NAME>`` is the index of each in that tuple.
"""

import struct

from .fields import HEADER_FIELDS, HEADER_BYTES

__all__ = ["HEADER_STRUCT"] + [f"H_{f.name.upper()}" for f in HEADER_FIELDS]

_CODE = {8: "b", 16: "h", 32: "i", 64: "q"}

HEADER_STRUCT = struct.Struct(">" + "".join(
    _CODE[f.bits] if f.signed else _CODE[f.bits].upper() for f in HEADER_FIELDS))
assert HEADER_STRUCT.size == HEADER_BYTES

for _i, _f in enumerate(HEADER_FIELDS):
    globals()[f"H_{_f.name.upper()}"] = _i
del _i, _f
