"""numpy view of the wire format: a structured dtype to pack/unpack many headers at once."""

import numpy as np

from .fields import HEADER_FIELDS, HEADER_BYTES, VERSION, MsgType

__all__ = ["HEADER_DTYPE", "ELEM_DTYPE", "pack", "unpack", "headers_from_buffer"]

ELEM_DTYPE = np.dtype(">i4")


def _dtype() -> np.dtype:
    spec = []
    for f in HEADER_FIELDS:
        kind = "i" if f.signed else "u"
        spec.append((f.name, f">{kind}{f.nbytes}"))
    dt = np.dtype(spec)
    assert dt.itemsize == HEADER_BYTES
    return dt


HEADER_DTYPE = _dtype()


def pack(elements=None, **fields) -> bytes:
    """One datagram: header fields by name, then the elements as big-endian int32."""
    hdr = np.zeros((), HEADER_DTYPE)
    hdr["version"] = VERSION
    hdr["type"] = MsgType.DATA
    elems = np.asarray(elements if elements is not None else [], dtype=ELEM_DTYPE)
    hdr["nelem"] = elems.size
    for name, value in fields.items():
        hdr[name] = value
    return hdr.tobytes() + elems.tobytes()


def unpack(datagram: bytes):
    """(header record, elements as native int32). Raises ValueError if truncated."""
    if len(datagram) < HEADER_BYTES:
        raise ValueError(f"truncated header: {len(datagram)} < {HEADER_BYTES} bytes")
    hdr = np.frombuffer(datagram, HEADER_DTYPE, count=1)[0]
    body = np.frombuffer(datagram, ELEM_DTYPE, offset=HEADER_BYTES,
                         count=(len(datagram) - HEADER_BYTES) // 4)
    return hdr, body.astype(np.int32)


def headers_from_buffer(buf, count: int, stride: int) -> np.ndarray:
    """Strided view of ``count`` headers that start every ``stride`` bytes in ``buf``."""
    base = np.frombuffer(buf, np.uint8)
    return np.ndarray((count,), HEADER_DTYPE, buffer=base, offset=0, strides=(stride,))
