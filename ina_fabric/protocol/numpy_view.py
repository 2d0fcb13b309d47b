"""numpy view of the wire format: a structured dtype to pack/unpack many headers at once."""

import numpy as np

from .fields import HEADER_FIELDS, HEADER_BYTES, VERSION, MsgType, WIDTH_BITS

__all__ = ["HEADER_DTYPE", "ELEM_DTYPE", "ELEM_DTYPES", "elem_dtype", "pack", "unpack",
           "headers_from_buffer"]

ELEM_DTYPE = np.dtype(">i4")
#: the element dtype of each width code (``fields.WIDTH_BITS``), big-endian as on the wire
ELEM_DTYPES = {code: np.dtype(f">i{bits // 8}") for code, bits in WIDTH_BITS.items()}


def elem_dtype(width: int) -> np.dtype:
    """The dtype of the elements of a datagram with ``width`` byte ``width`` (its low
    nibble; a code that names no width reads as int32)."""
    return ELEM_DTYPES.get(width & 0xF, ELEM_DTYPE)


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
    """One datagram: header fields by name, then the elements, big-endian, of the width
    that the ``width`` field's low nibble names (default int32)."""
    hdr = np.zeros((), HEADER_DTYPE)
    hdr["version"] = VERSION
    hdr["type"] = MsgType.DATA
    dt = elem_dtype(int(fields.get("width", 0)))
    vals = np.asarray(elements if elements is not None else [], dtype=np.int64)
    lim = 1 << 8 * dt.itemsize - 1
    if vals.size and (vals.min() < -lim or vals.max() >= lim):
        raise ValueError(f"an element does not fit {8 * dt.itemsize} bits")
    elems = vals.astype(dt)
    hdr["nelem"] = elems.size
    for name, value in fields.items():
        hdr[name] = value
    return hdr.tobytes() + elems.tobytes()


def unpack(datagram: bytes):
    """(header record, elements as native int32, of the width the header names). Raises
    ValueError if truncated."""
    if len(datagram) < HEADER_BYTES:
        raise ValueError(f"truncated header: {len(datagram)} < {HEADER_BYTES} bytes")
    hdr = np.frombuffer(datagram, HEADER_DTYPE, count=1)[0]
    dt = elem_dtype(int(hdr["width"]))
    body = np.frombuffer(datagram, dt, offset=HEADER_BYTES,
                         count=(len(datagram) - HEADER_BYTES) // dt.itemsize)
    return hdr, body.astype(np.int32)


def headers_from_buffer(buf, count: int, stride: int) -> np.ndarray:
    """Strided view of ``count`` headers that start every ``stride`` bytes in ``buf``."""
    base = np.frombuffer(buf, np.uint8)
    return np.ndarray((count,), HEADER_DTYPE, buffer=base, offset=0, strides=(stride,))
