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

``make_collective(kind, rank, world, store, ...)`` builds one rank's collective;
``collective_factory(kind, ...)`` returns ``f(rank, world) -> Collective`` for a DDP comm
hook (the store defaults to torch.distributed's default store). ``hadamard=True`` wraps
any of them in the randomized Hadamard transform.
"""

from .base import Collective, DirStore, HadamardCollective
from .deadline import DeadlinePolicy, SwitchDeadline
from .hadamard import RandomizedHadamard, fwht
from .tar import Mesh, TarUdp, TarTcp, RingTcp
from .consistency import ReplicaGuard, drift

__all__ = ["Collective", "DirStore", "HadamardCollective", "DeadlinePolicy",
           "SwitchDeadline", "RandomizedHadamard", "fwht", "Mesh", "TarUdp", "TarTcp",
           "RingTcp", "ReplicaGuard", "drift", "make_collective", "collective_factory",
           "KINDS"]

KINDS = ("gloo", "ring-tcp", "tar-tcp", "tar-udp", "switch-reliable", "switch-bounded")


def make_collective(kind, rank, world, store=None, *, impairment=None, elements=1024,
                    deadline=None, calibration=5, early_fraction=0.25, hadamard=False,
                    seed=0, switch=None, switch_control=None, window=64, job=1,
                    fill="local", resolve="local",
                    prefix=None):
    """One rank's collective of ``kind`` (see ``KINDS``).

    ``impairment``: a ``host.transport.impair.Impairment`` applied to this rank's sends
    (UDP datagrams; for the TCP kinds, per-segment delays and retransmission penalties;
    for the switch kinds, the uplink). ``deadline``: a fixed deadline in seconds (bounded
    kinds), or None for the adaptive policy. ``switch``/``switch_control``: the switch's
    address and its ``LiveSwitch`` control port. ``fill``/``resolve``: see ``TarUdp``."""
    if kind not in KINDS:
        raise ValueError(f"collective {kind!r}: expected one of {', '.join(KINDS)}")
    if store is None and kind != "gloo":
        import torch.distributed as dist
        store = dist.distributed_c10d._get_default_store()
    prefix = prefix or kind

    def policy():
        if deadline is not None:
            return DeadlinePolicy(fixed=deadline, early_fraction=early_fraction)
        return DeadlinePolicy(calibration=calibration, early_fraction=early_fraction)

    if kind == "gloo":
        from .adapters import GlooCollective
        c = GlooCollective()
    elif kind in ("ring-tcp", "tar-tcp", "tar-udp"):
        tcp_imp = impairment if kind != "tar-udp" else None
        mesh = Mesh(rank, world, store, prefix=prefix,
                    impairment=impairment if kind == "tar-udp" else None,
                    tcp_impairment=tcp_imp, seg_bytes=4 * elements)
        if kind == "ring-tcp":
            c = RingTcp(mesh, own_mesh=True)
        elif kind == "tar-tcp":
            c = TarTcp(mesh, own_mesh=True)
        else:
            c = TarUdp(mesh, elements, policy(), policy(), fill=fill, own_mesh=True,
                       resolve=resolve)
    else:
        from .adapters import switch_collective
        if switch is None:
            raise ValueError(f"collective {kind}: needs the switch address")
        mode = kind.split("-")[1]
        sp = SwitchDeadline(policy()) if mode == "bounded" else None
        c = switch_collective(rank, world, store, switch, switch_control, mode=mode, job=job,
                              window=window, elements=elements,
                              deadline=deadline or 0.005, policy=sp,
                              impairment=impairment, prefix=prefix)
    if hadamard:
        c = HadamardCollective(c, seed=seed)
    return c


def collective_factory(kind, store=None, **options):
    """``f(rank, world) -> Collective`` for a comm hook; ``options`` as make_collective."""
    def make(rank, world):
        return make_collective(kind, rank, world, store, **options)
    return make
