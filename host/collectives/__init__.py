"""Collectives behind one interface: ``Collective.allreduce(x) -> (sum, stats)``.

=================  =========================================================
kind               what
=================  =========================================================
``gloo``           ``torch.distributed.all_reduce`` on Gloo (the baseline)
``ring-tcp``       Gloo's ring algorithm over our TCP mesh (impairable)
``tar-tcp``        Transpose AllReduce over TCP: reliable, exact
``tar-udp``        Transpose AllReduce over UDP, bounded in time (OptiReduce style)
``switch-reliable`` in-network aggregation, reliable (``SwitchClient``)
``switch-bounded`` in-network aggregation, bounded, switch deadline from the policy
=================  =========================================================

``make_collective(kind, rank, world, store, options, ...)`` builds one rank's collective;
``collective_factory(kind, ...)`` returns ``f(rank, world) -> Collective`` for a DDP comm
hook (the store defaults to torch.distributed's default store). ``hadamard=True`` wraps
any of them in the randomized Hadamard transform.
"""

import dataclasses
from dataclasses import dataclass

from ina_fabric.protocol.jobtable import job_defaults

from .base import Collective, DirStore, HadamardCollective
from ..deadline import DeadlinePolicy, SwitchDeadline
from .hadamard import RandomizedHadamard, fwht, DEFAULT_BLOCK
from .tar import Mesh, TarUdp, TarTcp, RingTcp
from .consistency import ReplicaGuard, drift

__all__ = ["Collective", "DirStore", "HadamardCollective", "DeadlinePolicy",
           "SwitchDeadline", "RandomizedHadamard", "fwht", "Mesh", "TarUdp", "TarTcp",
           "RingTcp", "ReplicaGuard", "drift", "make_collective", "collective_factory",
           "CollectiveOptions", "SwitchTarget", "KINDS"]

KINDS = ("gloo", "ring-tcp", "tar-tcp", "tar-udp", "switch-reliable", "switch-bounded")


@dataclass(frozen=True)
class CollectiveOptions:
    """How a collective runs (everything but who takes part and where the switch is).

    ``elements``: elements per datagram (TAR) or per packet (switch kinds).
    ``deadline``: a fixed deadline in seconds for the bounded kinds, or None for the
    adaptive policy (``calibration`` calls, then ``early_fraction``). ``hadamard`` wraps
    the collective in the randomized Hadamard transform seeded by ``seed``, one transform
    per ``hadamard_block`` entries (None: the whole bucket padded to a power of two).
    ``fill``/``resolve``/``hold`` (the straggler bound, in deadlines): see ``TarUdp``."""
    elements: int = 1024
    deadline: float | None = None
    calibration: int = 5
    early_fraction: float = 0.25
    hadamard: bool = False
    hadamard_block: int | None = DEFAULT_BLOCK
    seed: int = 0
    fill: str = "local"
    resolve: str = "local"
    hold: float | None = 3.0


@dataclass(frozen=True)
class SwitchTarget:
    """Where the switch kinds aggregate: the switch's data address, its ``LiveSwitch``
    control port (or None), the job id and the job's window."""
    address: tuple
    control: tuple | None = None
    job: int = 1
    window: int = job_defaults().window


def make_collective(kind, rank, world, store=None, options: CollectiveOptions | None = None,
                    *, impairment=None, switch: SwitchTarget | None = None, prefix=None,
                    bind="127.0.0.1", **changes):
    """One rank's collective of ``kind`` (see ``KINDS``).

    ``options``: a :class:`CollectiveOptions` (``changes`` are applied to it, e.g.
    ``elements=512``). ``impairment``: a ``host.transport.impair.Impairment`` applied to
    this rank's sends (UDP datagrams; for the TCP kinds, per-segment delays and
    retransmission penalties; for the switch kinds, the uplink). ``switch``: a
    :class:`SwitchTarget`, needed by the switch kinds. ``bind``: the local address of the
    TAR/ring mesh (a lab host's own address; loopback by default)."""
    if kind not in KINDS:
        raise ValueError(f"collective {kind!r}: expected one of {', '.join(KINDS)}")
    o = dataclasses.replace(options or CollectiveOptions(), **changes)
    if store is None and kind != "gloo":
        import torch.distributed as dist
        store = dist.distributed_c10d._get_default_store()
    prefix = prefix or kind

    def policy():
        if o.deadline is not None:
            return DeadlinePolicy(fixed=o.deadline, early_fraction=o.early_fraction)
        return DeadlinePolicy(calibration=o.calibration, early_fraction=o.early_fraction)

    if kind == "gloo":
        from .adapters import GlooCollective
        c = GlooCollective()
    elif kind in ("ring-tcp", "tar-tcp", "tar-udp"):
        tcp_imp = impairment if kind != "tar-udp" else None
        mesh = Mesh(rank, world, store, host=bind, prefix=prefix,
                    impairment=impairment if kind == "tar-udp" else None,
                    tcp_impairment=tcp_imp, seg_bytes=4 * o.elements)
        if kind == "ring-tcp":
            c = RingTcp(mesh, own_mesh=True)
        elif kind == "tar-tcp":
            c = TarTcp(mesh, own_mesh=True)
        else:
            c = TarUdp(mesh, o.elements, policy(), policy(), fill=o.fill, own_mesh=True,
                       resolve=o.resolve, hold=o.hold)
    else:
        from .adapters import switch_collective
        if switch is None:
            raise ValueError(f"collective {kind}: needs switch=SwitchTarget(...)")
        mode = kind.split("-")[1]
        sp = SwitchDeadline(policy()) if mode == "bounded" else None
        settings = job_defaults(window=switch.window, elements=o.elements, mode=mode,
                                deadline=o.deadline)
        c = switch_collective(rank, world, store, switch.address, switch.control,
                              job=switch.job, settings=settings, policy=sp,
                              impairment=impairment, prefix=prefix)
    if o.hadamard:
        c = HadamardCollective(c, seed=o.seed, block=o.hadamard_block)
    return c


def collective_factory(kind, store=None, **kwargs):
    """``f(rank, world) -> Collective`` for a comm hook; ``kwargs`` as make_collective."""
    def make(rank, world):
        return make_collective(kind, rank, world, store, **kwargs)
    return make
