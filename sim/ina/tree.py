"""Traffic for the core as the spine of a two-level tree of switches (docs/fabric.md).

The leaves are reference models (``SwitchModel`` with a parent): seeded worker traffic
(``traffic.generate``, every impairment) goes into them, and what they send upward is
the spine's input. The loop is closed while the traffic is made: a spine model answers
the leaves (their slots close only when the spine's RESULT comes back, so they reuse
records and keep going), and both directions lose datagrams. A worker re-sends, on its
timeout, each DATA of its own whose RESULT has not reached it: its leaf takes it (a DATA
the leaf had dropped ahead of its window), or answers with the stored upward DATA again
(``up_resent``, RETRANSMIT: a lost upward DATA or a lost RESULT), which the spine answers
with a unicast re-send of its RESULT. The workers do not hold back at a window (the
traffic is open loop), so in a long run a leaf whose RESULT was lost after the spine had
moved 2W on stays behind, and its re-sends are stale at the spine (checked too). The spine's input also gets duplicates and what a spine must drop: a count
of 0 or above the job's workers, a child switch that is not a member.

The core under test then takes that input (with idle cycles and backpressure), and the
scoreboard's model, a spine with the same jobs, checks every output and counter
(``tb_core.test_tree_spine``). Counts past 255 (the 16-bit ``count``): job 9's leaves
stand for ``scale`` workers per worker (their upward count and the spine's total are
multiplied by it), which is what the spine of a 1,024-worker job sees.

Returns ``(spine_jobs, [(datagram, source)])``.
"""

import numpy as np

from ina_fabric.host.switch.model import SwitchModel
from ina_fabric.protocol.fields import MsgType, Flags, HEADER_BYTES, field_offsets
from ina_fabric.protocol.jobtable import JobConfig, GATEWARE_MODES
from ina_fabric.protocol.numpy_view import HEADER_DTYPE

from .traffic import Mix, generate

__all__ = ["SPINE", "spine_jobs", "generate_tree"]

#: the spine's address (the core): the leaves' parent
SPINE = ("10.0.0.254", 4791)
_OFF = field_offsets()


def _leaf_addr(job: int, leaf: int):
    return f"10.2.{job % 256}.{leaf + 1}", 4800 + leaf


def spine_jobs(*, window=4, elements=4, deadline_cycles=300, leaves=(3, 2),
               workers=(3, 4), scale=(1, 100)):
    """Two spine jobs: 7 reliable with unicast copies to its leaves, 9 bounded with an IP
    multicast group and counts scaled past 255. ``leaves[k]`` leaves of ``workers[k]``
    workers each; returns (spine configs, leaf configs by (job, leaf), scales by job)."""
    spines, leafs, scales = [], {}, {}
    for k, (job, mode, session) in enumerate(((7, "reliable", 0x7A3F_19C2_0000_0107),
                                              (9, "bounded", 0xFFFF_FFFF_0000_0109))):
        members = tuple(f"{_leaf_addr(job, i)[0]}:{_leaf_addr(job, i)[1]}"
                        f"@02:00:00:00:{job:02x}:{i + 1:02x}" for i in range(leaves[k]))
        spines.append(JobConfig(
            job, members, window=window, elements=elements, mode=mode,
            deadline=float(deadline_cycles) if mode == "bounded" else 1.0,
            mcast=("239.1.2.9", 7009) if mode == "bounded" else None, session=session,
            children=True, workers=leaves[k] * workers[k] * scale[k]))
        scales[job] = scale[k]
        for i in range(leaves[k]):
            wm = tuple(f"10.3.{16 * k + i}.{w + 1}:{5000 + w}@02:00:00:03:{16 * k + i:02x}:"
                       f"{w + 1:02x}" for w in range(workers[k]))
            leafs[(job, i)] = JobConfig(job, wm, window=window, elements=elements,
                                        mode=mode, deadline=40.0, session=session,
                                        parent=SPINE, index=i)
    return spines, leafs, scales


def _set(d: bytes, field: str, value: int, size: int) -> bytes:
    b = bytearray(d)
    b[_OFF[field]:_OFF[field] + size] = value.to_bytes(size, "big")
    return bytes(b)


def generate_tree(n_seq: int, seed: int, *, window=4, elements=4, deadline_cycles=300,
                  loss=0.03, dup=0.03, bad=0.02, mix: Mix | None = None):
    """The spine's input for ``n_seq`` seqs per job (the module docstring)."""
    rng = np.random.default_rng(seed)
    spines, leafs, scales = spine_jobs(window=window, elements=elements,
                                       deadline_cycles=deadline_cycles)
    # (short_nelem 0: the leaves draw their traffic apart, and every worker of a seq
    # sends the same element count)
    mix = mix or Mix(loss=0.03, dup=0.03, late=0.02, overflow=0.03, short_nelem=0.0,
                     bad=0.02)
    # the leaves' worker traffic, interleaved by position (every leaf at the same pace)
    streams = []
    for n, (key, cfg) in enumerate(sorted(leafs.items())):
        t = generate([cfg], n_seq, seed * 101 + n, mix)
        streams += [(i / len(t), rng.random(), key, d, s) for i, (d, s) in enumerate(t)]
    streams.sort(key=lambda e: e[:2])
    spine = SwitchModel(spines, modes=GATEWARE_MODES, answers=False)
    leaf_models = {key: SwitchModel([cfg], answers=False) for key, cfg in leafs.items()}
    addr_of = {key: _leaf_addr(*key) for key in leafs}
    by_addr = {a: key for key, a in addr_of.items()}
    total = {cfg.job: cfg.total for cfg in spines}
    out = []

    def up(key, d, now):
        """An upward DATA of leaf ``key``: scaled, maybe lost or doubled, maybe with
        something the spine must drop beside it; what the spine answers goes back down
        (maybe lost)."""
        job = key[0]
        h = np.frombuffer(d, HEADER_DTYPE, count=1)[0]
        d = _set(d, "count", int(h["count"]) * scales[job], 2)
        src = addr_of[key]
        copies = [] if rng.random() < loss else [d]
        if copies and rng.random() < dup:
            copies.append(d)
        if rng.random() < bad:
            kind = int(rng.integers(0, 3))
            if kind == 0:
                copies.insert(0, (_set(d, "count", 0, 2), src))
            elif kind == 1:
                copies.insert(0, (_set(d, "count", total[job] + 1 + int(rng.integers(0, 3)),
                                       2), src))
            else:
                copies.insert(0, (d, ("10.2.99.1", src[1])))      # not a member
        for c in copies:
            dg, s = c if isinstance(c, tuple) else (c, src)
            out.append((dg, s))
            for dest, res in spine.process(dg, s, now):
                down(dest, res, now)

    # each worker's DATA per seq, until a RESULT of that seq reaches it (its leaf relayed
    # it or re-sent it): a worker re-sends what it has no RESULT of on its timeout
    waiting = {}        # (leaf, worker address, seq) -> [datagram, time of the last send]
    members = {key: {m.addr for m in cfg.members} for key, cfg in leafs.items()}

    def answered(key, outs):
        for dest, o in outs:
            if o[1] == MsgType.RESULT and tuple(dest) in members[key]:
                seq = int.from_bytes(o[_OFF["seq"]:_OFF["seq"] + 4], "big")
                waiting.pop((key, tuple(dest), seq), None)

    def down(dest, res, now):
        if res[1] != MsgType.RESULT or rng.random() < loss:
            return
        job = int.from_bytes(res[_OFF["job"]:_OFF["job"] + 2], "big")
        for key in ([by_addr[tuple(dest)]] if tuple(dest) in by_addr else
                    [k for k in leafs if k[0] == job]):
            answered(key, leaf_models[key].process(res, SPINE, now))

    def leaf(key, d, s, now):
        outs = leaf_models[key].process(d, s, now)
        answered(key, outs)
        for dest, o in outs:
            if tuple(dest) == SPINE and o[1] == MsgType.DATA:
                up(key, o, now)

    def own_data(key, d, s):
        """The seq of a worker's well-formed DATA of its leaf's job, else None."""
        cfg = leafs[key]
        if len(d) < HEADER_BYTES or tuple(s) not in members[key]:
            return None
        h = np.frombuffer(d, HEADER_DTYPE, count=1)[0]
        if (int(h["type"]) == MsgType.DATA and int(h["job"]) == cfg.job
                and int(h["session"]) == cfg.session and int(h["worker"]) < cfg.n
                and cfg.members[int(h["worker"])].addr == tuple(s)
                and len(d) == HEADER_BYTES + 4 * int(h["nelem"])):
            return int(h["seq"])
        return None

    def worker_sends(key, d, s, now):
        q = own_data(key, d, s)
        if q is not None:
            waiting.setdefault((key, tuple(s), q), [d, now])
        leaf(key, d, s, now)

    def resend(now):
        for (key, s, seq), entry in sorted(waiting.items()):
            if now - entry[1] >= timeout and (key, s, seq) in waiting:
                entry[1] = now
                b = bytearray(entry[0])
                b[_OFF["flags"]] |= Flags.RETRANSMIT
                leaf(key, bytes(b), s, now)

    timeout = 6.0 * window * len(leafs)
    now = 0.0
    for n, (_, _, key, d, s) in enumerate(streams):
        now += 1.0
        worker_sends(key, d, s, now)
        if n % 16 == 0:
            resend(now)
    for _ in range(8):        # until every worker has its RESULTs (or its seq is gone)
        if not waiting:
            break
        now += timeout
        resend(now)
    for key, lm in leaf_models.items():       # the leaves' last deadlines
        for dest, o in lm.tick(now + 1e6):
            if tuple(dest) == SPINE and o[1] == MsgType.DATA:
                up(key, o, now + 1e6)
    return spines, out

