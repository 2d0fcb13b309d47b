"""The knobs the controller turns, and the set it may choose from.

* ``precision``: bits per gradient element on the wire. 32 is plain float32; 16, 8 and 4
  are signed integers with one float32 scale per chunk (``compress.py``), stochastically
  rounded so the compressed gradient is unbiased.
* ``accum``: gradient accumulation steps ``a``. The optimizer steps (and the workers
  communicate) once every ``a`` micro-batches, so the global batch is ``a * b * N``.
* ``pace``: the sending rate, as the fraction of its access link a worker's pacer lets
  its gradient messages use (1: unpaced). A network knob beside precision; it is in the
  candidate set only when the objective prices the link share a job holds
  (``JobParams.rate_price``, see ``costmodel``): with the job's own time as the only cost
  a paced sender is never faster, so the default set is ``paces=(1.0,)``.
"""

from dataclasses import dataclass
import itertools
import math

__all__ = ["Knobs", "KnobSpace", "PRECISIONS", "ACCUMS", "PACES", "ConfigError"]

PRECISIONS = (32, 16, 8, 4)
ACCUMS = (1, 2, 4, 8, 16)
#: the pacing choices offered when the pace knob is on (``--paces``)
PACES = (1.0, 0.5, 0.25)


# a bad controller / cost-model configuration (one-line reason): the project's one
# ConfigError, a ValueError
from ina_fabric.protocol.jobtable import ConfigError  # noqa: E402


@dataclass(frozen=True, order=True)
class Knobs:
    precision: int = 32
    accum: int = 1
    pace: float = 1.0

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision {self.precision!r}: must be one of {PRECISIONS}")
        if not isinstance(self.accum, int) or self.accum < 1:
            raise ConfigError(f"accumulation steps {self.accum!r}: must be an integer >= 1")
        if not isinstance(self.pace, (int, float)) or not math.isfinite(self.pace) or \
                not 0.0 < self.pace <= 1.0:
            raise ConfigError(f"pace {self.pace!r}: must be a fraction of the link in (0, 1]")

    def __str__(self):
        s = f"{'fp32' if self.precision == 32 else f'int{self.precision}'}/a={self.accum}"
        return s if self.pace == 1.0 else f"{s}/pace={self.pace:g}"


@dataclass(frozen=True)
class KnobSpace:
    """The candidate values of each knob; ``default`` is the static configuration
    (the value the one-knob controllers keep for the knob they do not turn)."""
    precisions: tuple = PRECISIONS
    accums: tuple = ACCUMS
    default: Knobs = Knobs(32, 1)
    paces: tuple = (1.0,)

    def __post_init__(self):
        object.__setattr__(self, "precisions", tuple(self.precisions))
        object.__setattr__(self, "accums", tuple(self.accums))
        object.__setattr__(self, "paces", tuple(float(r) if isinstance(r, int) else r
                                                for r in self.paces))
        if not self.precisions:
            raise ConfigError("empty knob set: no precision to choose from")
        if not self.accums:
            raise ConfigError("empty knob set: no accumulation step count to choose from")
        if not self.paces:
            raise ConfigError("empty knob set: no pace to choose from")
        for p in self.precisions:
            Knobs(p, 1)
        for a in self.accums:
            Knobs(32, a)
        for r in self.paces:
            Knobs(32, 1, r)
        if len(set(self.precisions)) != len(self.precisions) or \
                len(set(self.accums)) != len(self.accums) or \
                len(set(self.paces)) != len(self.paces):
            raise ConfigError("knob set has duplicate values")
        if self.default.precision not in self.precisions or \
                self.default.accum not in self.accums or self.default.pace not in self.paces:
            raise ConfigError(f"default knobs {self.default} are not in the knob set "
                              f"(precisions {self.precisions}, accums {self.accums}, "
                              f"paces {self.paces})")

    def all(self):
        """Every (precision, accum, pace) combination, as Knobs."""
        return [Knobs(p, a, r) for p, a, r in
                itertools.product(self.precisions, self.accums, self.paces)]
