"""The precision of an allreduce call (issue 40, docs/precision.md): the element width on
the wire, the rounding, and the optional randomized Hadamard rotation (THC).

``Precision.parse`` reads the form that ``INA_PRECISION``, ``ina allreduce --precision``
and ``--width`` take: a width (``32``, ``16``, ``8``, or ``int32``, ``int16``, ``int8``),
then optionally ``:stochastic`` and/or ``:hadamard``, e.g. ``int8:stochastic:hadamard``.
"""

from dataclasses import dataclass

__all__ = ["Precision", "WIDTHS", "ROUNDINGS", "as_precision"]

WIDTHS = (32, 16, 8)
ROUNDINGS = ("nearest", "stochastic")


@dataclass(frozen=True)
class Precision:
    """``bits``: the elements' width on the wire (32, 16 or 8); ``rounding``: ``nearest``
    (deterministic, half to even) or ``stochastic`` (unbiased, from the call's shared
    seed); ``rotate``: a randomized Hadamard rotation before quantization (THC)."""
    bits: int = 32
    rounding: str = "nearest"
    rotate: bool = False

    def __post_init__(self):
        if self.bits not in WIDTHS:
            raise ValueError(f"precision: width {self.bits!r} (expected 32, 16 or 8)")
        if self.rounding not in ROUNDINGS:
            raise ValueError(f"precision: rounding {self.rounding!r} (expected nearest or "
                             f"stochastic)")

    @property
    def stochastic(self) -> bool:
        return self.rounding == "stochastic"

    @classmethod
    def parse(cls, text) -> "Precision":
        """``32`` | ``int16`` | ``8:stochastic`` | ``int8:stochastic:hadamard`` ...;
        ValueError with the accepted forms otherwise."""
        parts = [p.strip().lower() for p in str(text).split(":")]
        head = parts[0][3:] if parts[0].startswith("int") else parts[0]
        if not head.isdigit() or int(head) not in WIDTHS:
            raise ValueError(f"precision {text!r}: expected 32, 16 or 8 (or int32, int16, "
                             f"int8), optionally followed by :stochastic and/or :hadamard")
        rounding, rotate = "nearest", False
        for opt in parts[1:]:
            if opt in ("stochastic", "sr"):
                rounding = "stochastic"
            elif opt in ("nearest", "rn"):
                rounding = "nearest"
            elif opt in ("hadamard", "rht", "rotate"):
                rotate = True
            else:
                raise ValueError(f"precision {text!r}: unknown option {opt!r} (expected "
                                 f"stochastic, nearest or hadamard)")
        return cls(int(head), rounding, rotate)

    def __str__(self):
        return f"int{self.bits}" + (":stochastic" if self.stochastic else "") + (
            ":hadamard" if self.rotate else "")


def as_precision(p) -> Precision:
    """A ``Precision`` from a width (int), a string (``Precision.parse``), a Precision,
    or None (int32)."""
    if p is None:
        return Precision()
    if isinstance(p, Precision):
        return p
    if isinstance(p, int) and not isinstance(p, bool):
        return Precision(p)
    if isinstance(p, str):
        return Precision.parse(p)
    raise ValueError(f"precision {p!r}: expected a width (32, 16, 8), a string such as "
                     f"'int8:stochastic', or a Precision")
