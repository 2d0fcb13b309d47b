"""Five controllers behind one interface, and the telemetry that feeds them.

Every control interval the caller builds a ``CostModel`` from what it measured
(``Telemetry.model``) and calls ``controller.decide(model)``, which returns the knobs to use
until the next interval. The controllers differ only in which candidates they consider:

* ``Static``: always ``space.default`` (float32, a=1 unless configured otherwise).
* ``PrecisionOnly``: the network knobs, best precision (and pace, when the space offers
  more than one), accumulation kept at the default.
* ``AccumulationOnly``: best accumulation, the network knobs kept at their defaults
  (float32, unpaced).
* ``Decoupled``: the network knobs and the ML knob each tuned with the other at its
  default, then the choices combined: ((q, r) best | a=a0, a best | q=q0, r=r0). This is
  what two independent controllers, one in the network stack and one in the training
  framework, would do.
* ``Joint``: argmin of predicted time to target over the whole product space.

All adaptive controllers share the same hysteresis, so the comparison isolates the
decision rule: the knobs change only if the proposal is predicted to be at least
``hysteresis`` (relative) faster than keeping the current knobs, and at least ``dwell``
intervals after the last change. This keeps a controller from flapping when two choices
are nearly tied and the measurements are noisy.
"""

import abc
from dataclasses import dataclass, field

from .costmodel import CostModel, JobParams
from .knobs import ConfigError, Knobs, KnobSpace
from .measure import BandwidthMeter, ComputeMeter, NoiseScaleEstimator, QuantErrorMeter

__all__ = ["Controller", "Static", "PrecisionOnly", "AccumulationOnly", "Decoupled", "Joint",
           "CONTROLLERS", "make_controller", "Telemetry"]


class Controller(abc.ABC):
    name = "controller"

    def __init__(self, space: KnobSpace = None, hysteresis: float = 0.05, dwell: int = 1):
        self.space = space if space is not None else KnobSpace()
        if hysteresis < 0:
            raise ConfigError(f"hysteresis={hysteresis!r}: must be >= 0")
        if dwell < 0:
            raise ConfigError(f"dwell={dwell!r}: must be >= 0 intervals")
        self.hysteresis = hysteresis
        self.dwell = dwell
        self.current = self.space.default
        self.since_change = dwell   # free to act at the first interval
        self.changes = 0

    @abc.abstractmethod
    def candidates(self):
        """The knob settings this controller may choose among (its rule's search space)."""

    def propose(self, model: CostModel) -> Knobs:
        """The knobs this controller's rule picks under ``model`` (no hysteresis)."""
        return model.best(self.candidates())

    def decide(self, model: CostModel) -> Knobs:
        proposal = self.propose(model)
        self.since_change += 1
        if proposal != self.current and self.since_change > self.dwell:
            if model.rate(self.current) > (1.0 + self.hysteresis) * model.rate(proposal):
                self.current = proposal
                self.since_change = 0
                self.changes += 1
        return self.current


class Static(Controller):
    name = "static"

    def candidates(self):
        return [self.space.default]


class PrecisionOnly(Controller):
    name = "precision-only"

    def candidates(self):
        a = self.space.default.accum
        return [Knobs(q, a, r) for q in self.space.precisions for r in self.space.paces]


class AccumulationOnly(Controller):
    name = "accumulation-only"

    def candidates(self):
        d = self.space.default
        return [Knobs(d.precision, a, d.pace) for a in self.space.accums]


class Decoupled(Controller):
    """A network controller (precision, and pace when offered) and an accumulation
    controller that do not know about each other: each runs its own rule (with its own
    hysteresis) as if the other's knobs were at their defaults, and the job uses both
    outputs."""
    name = "decoupled"

    def __init__(self, space=None, hysteresis=0.05, dwell=1):
        super().__init__(space, hysteresis, dwell)
        self.net = PrecisionOnly(self.space, hysteresis, dwell)
        self.ml = AccumulationOnly(self.space, hysteresis, dwell)

    def candidates(self):
        return self.space.all()

    def propose(self, model):
        net = self.net.propose(model)
        return Knobs(net.precision, self.ml.propose(model).accum, net.pace)

    def decide(self, model):
        net = self.net.decide(model)
        new = Knobs(net.precision, self.ml.decide(model).accum, net.pace)
        if new != self.current:
            self.current = new
            self.changes += 1
        return self.current


class Joint(Controller):
    name = "joint"

    def candidates(self):
        return self.space.all()


CONTROLLERS = {c.name: c for c in (Static, PrecisionOnly, AccumulationOnly, Decoupled, Joint)}


def make_controller(name: str, space: KnobSpace = None, **kw) -> Controller:
    try:
        cls = CONTROLLERS[name]
    except KeyError:
        raise ConfigError(f"unknown controller {name!r}; have: {', '.join(CONTROLLERS)}") from None
    return cls(space, **kw)


@dataclass
class Telemetry:
    """The online meters, and the cost model they imply on top of what is known a priori
    (``base``: model size, workers, micro-batch, and priors for anything not yet measured)."""
    base: JobParams
    bandwidth: BandwidthMeter = field(default_factory=BandwidthMeter)
    compute: ComputeMeter = field(default_factory=ComputeMeter)
    noise: NoiseScaleEstimator = field(default_factory=NoiseScaleEstimator)
    quant: QuantErrorMeter = field(default_factory=QuantErrorMeter)
    # the noise-scale estimate is a ratio of two noisy averages: keep the prior until
    # this many pairs of norms have been averaged
    min_noise_samples: int = 3

    def params(self) -> JobParams:
        kw = {}
        if self.bandwidth.value:
            kw["bandwidth"] = self.bandwidth.value
        if self.compute.value is not None:
            kw["t_compute"] = self.compute.value
        if self.noise.value is not None and self.noise.count >= self.min_noise_samples:
            kw["b_noise"] = self.noise.value
        measured = {q: r for q, r in self.quant.value.items() if r is not None}
        if measured:
            kw["quant_ratio"] = {**self.base.quant_ratio, **measured}
        return self.base.with_(**kw)

    def model(self) -> CostModel:
        return CostModel(self.params())
