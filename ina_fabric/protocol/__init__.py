"""The INA wire format (``fields``) and its generated views (numpy, scapy, Wireshark).

The Amaranth ``data.StructLayout`` view lives in ``hw`` (it imports amaranth) and is
generated from the same :data:`HEADER_FIELDS`.
"""

from .fields import *  # noqa: F401,F403
from .fields import __all__ as _fields_all
from .numpy_view import HEADER_DTYPE, ELEM_DTYPE, pack, unpack, headers_from_buffer

__all__ = list(_fields_all) + ["HEADER_DTYPE", "ELEM_DTYPE", "pack", "unpack",
                               "headers_from_buffer"]
