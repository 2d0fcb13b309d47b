"""The core as a leaf of a tree of switches (``CoreParams(tree=True, leaf=True)``).

docs/fabric.md defines the tree and ``host/switch/model.py`` the semantics; this is what
the header pipeline and the replicator add for them. A job whose ``parent`` register is
1 (the parent switch's address is in the global ``parent_*`` registers, one per core, as
``ina switch --parent``; the job's member id there in ``up_index``):

* **Up.** A record that closes (every member in, or its deadline in bounded mode) does
  not emit a RESULT: it becomes *up* and its sum goes to the parent as one DATA (request
  kind :data:`ReqKind.UP`): worker = ``up_index``, count = the workers it covers
  (``wcount``), bitmap = its members, the larger exponent, PARTIAL below the job's
  workers, OVERFLOW when an element saturated (counted in ``overflows``) or a child's
  DATA had it. The accumulators keep the sum, so the DATA can be built again. An up
  record neither expires again nor is reused (it is not complete).
* **A member's re-send at an up record.** Its bit is in the bitmap: a duplicate, and the
  upward DATA goes again with RETRANSMIT (the model's ``up_resent``: a lost upward DATA
  or a lost RESULT of the parent is recovered so); otherwise ``late``, nothing sent.
* **Down: the relay.** P0 takes a RESULT of such a job (any other RESULT is malformed at
  the type check, as in the model); P1b checks it in the model's order: from the parent
  (else ``drop_unknown_source``), with the job's session (``drop_bad_session``), for an
  up record holding its seq (else the model's ``drop_result``, a counter the gateware
  does not keep), with the record's element count and a count of at most
  ``MAX_JOB_WORKERS`` (else ``drop_malformed``). It is then relayed: its elements are
  written into the record's accumulators (``AccMode.OPEN``; it waits, as a reuse does,
  while the upward DATA is still queued or being read), and the record becomes complete
  holding the parent's count (``wcount``), exponent, flags (``pfl``, RETRANSMIT cleared)
  and whether the parent's bitmap has this switch's bit (``mine``). The relayed copies
  (request kind :data:`ReqKind.REL`) are the parent's bytes but for ``worker``
  (GROUP_WORKER), RETRANSMIT (cleared) and ``bitmap`` (the record's own members if
  ``mine``, else 0), to the job's group (members or multicast).
* **Re-sends at the lowest level.** A member's DATA at a relayed record is answered from
  the record (unicast, RETRANSMIT, its worker id), as a one-switch RESULT is.
* **Time.** As in the model, whose ``process`` ticks first: a packet that finds its
  record due closes it first (up), then is taken at the up record (a parent's RESULT for
  it is relayed once the upward DATA is out, a member's re-send sends it again).

What the gateware does not keep: the model's counters ``up``, ``up_resent``,
``relayed`` and ``drop_result`` (a register-map change; the benches check what they
count through the datagrams). A leaf's in-band CONTROL takes no tree entry (the
``parent`` and ``up_index`` registers are written over the register bus).
"""

from types import SimpleNamespace

from amaranth.hdl import *
from amaranth.lib import enum

from ina_fabric.protocol.fields import MAX_JOB_WORKERS

from .regfile import jobs_at

__all__ = ["ReqKind", "LEAF_RULES", "leaf_rules"]


class ReqKind(enum.Enum, shape=2):
    """What a request to the replicator sends (a core with ``leaf``)."""
    RESULT = 0      # this switch's RESULT (group, expired PARTIAL, re-send)
    UP = 1          # the partial sum to the parent, as DATA (RETRANSMIT when re-sent)
    REL = 2         # the parent's RESULT, relayed (group) or re-sent (unicast)


#: P1b's registered rules of a leaf (:data:`~.slot.RULE_FIELDS`' last; 0 without it)
LEAF_RULES = ("haspar", "up", "relay", "res_unksrc", "res_badsess", "res_drop", "res_malf")


def leaf_rules(m, P, op, cmp, md, jobs, job, k_pkt, k_expire):
    """P1b's rules of a leaf, from the operation ``op``, its registered compares ``cmp``,
    its record's metadata ``md`` and its job (the module docstring). ``k_pkt``: the
    operation is a packet; ``k_expire``: the record is due and open (the rule without a
    leaf). Returns the signals by name: ``res`` (a parent's RESULT), ``haspar``,
    ``expire`` (due and open and not up), ``up`` (the record is up or goes up now),
    ``relay``, ``defer`` (a relay that must wait), and the RESULT's drops."""
    def sig(name, value):
        s = Signal(name=f"leaf_{name}")
        m.d.comb += s.eq(value)
        return s
    haspar = sig("haspar", jobs_at(jobs, "parent", job))
    res = sig("res", k_pkt & op.res)
    expire = sig("expire", k_expire & ~md.up)
    up = sig("up", md.up | (expire & haspar))
    from_parent = res & cmp.src_ok
    ok = from_parent & op.sess_ok
    hit = ok & cmp.eq_seq & up
    malf = sig("malf", hit & (cmp.nelem_ne | (op.covers > MAX_JOB_WORKERS)))
    relay = sig("relay", hit & ~malf)
    return SimpleNamespace(
        res=res, haspar=haspar, expire=expire, up=up, relay=relay,
        # the relay writes the accumulators: after the upward DATA has read them (a
        # record that closes now sends it first, as the model's tick does)
        defer=sig("defer", relay & (expire | cmp.pend)),
        res_unksrc=res & ~cmp.src_ok, res_badsess=from_parent & ~op.sess_ok,
        res_drop=ok & ~(cmp.eq_seq & up), res_malf=malf)
