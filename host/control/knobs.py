"""The two knobs the controller turns, and the set it may choose from.

* ``precision``: bits per gradient element on the wire. 32 is plain float32; 16, 8 and 4
  are signed integers with one float32 scale per chunk (``compress.py``), stochastically
  rounded so the compressed gradient is unbiased.
* ``accum``: gradient accumulation steps ``a``. The optimizer steps (and the workers
  communicate) once every ``a`` micro-batches, so the global batch is ``a * b * N``.
"""

from dataclasses import dataclass
import itertools

__all__ = ["Knobs", "KnobSpace", "PRECISIONS", "ACCUMS", "ConfigError"]

PRECISIONS = (32, 16, 8, 4)
ACCUMS = (1, 2, 4, 8, 16)


class ConfigError(ValueError):
    """A bad controller / cost-model configuration (one-line reason)."""


@dataclass(frozen=True, order=True)
class Knobs:
    precision: int = 32
    accum: int = 1

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision {self.precision!r}: must be one of {PRECISIONS}")
        if not isinstance(self.accum, int) or self.accum < 1:
            raise ConfigError(f"accumulation steps {self.accum!r}: must be an integer >= 1")

    def __str__(self):
        return f"{'fp32' if self.precision == 32 else f'int{self.precision}'}/a={self.accum}"


@dataclass(frozen=True)
class KnobSpace:
    """The candidate values of each knob; ``default`` is the static configuration
    (the value the one-knob controllers keep for the knob they do not turn)."""
    precisions: tuple = PRECISIONS
    accums: tuple = ACCUMS
    default: Knobs = Knobs(32, 1)

    def __post_init__(self):
        object.__setattr__(self, "precisions", tuple(self.precisions))
        object.__setattr__(self, "accums", tuple(self.accums))
        if not self.precisions:
            raise ConfigError("empty knob set: no precision to choose from")
        if not self.accums:
            raise ConfigError("empty knob set: no accumulation step count to choose from")
        for p in self.precisions:
            Knobs(p, 1)
        for a in self.accums:
            Knobs(32, a)
        if len(set(self.precisions)) != len(self.precisions) or \
                len(set(self.accums)) != len(self.accums):
            raise ConfigError("knob set has duplicate values")
        if self.default.precision not in self.precisions or self.default.accum not in self.accums:
            raise ConfigError(f"default knobs {self.default} are not in the knob set "
                              f"(precisions {self.precisions}, accums {self.accums})")

    def all(self):
        """Every (precision, accum) pair, as Knobs."""
        return [Knobs(p, a) for p, a in itertools.product(self.precisions, self.accums)]
