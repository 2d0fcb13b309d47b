"""Python models of the header pipeline's stages (hw/ina/slot_*.py), written from the
module docstrings and the model's rules (``host/switch/model.py``), for the stage
benches: what each stage registers from its inputs."""

from ina_fabric.hw.ina.layout import OpKind, Reason
from ina_fabric.hw.ina.leaf import LEAF_RULES
from ina_fabric.hw.ina.slot import due_reached_py, seq_at_or_behind_py

__all__ = ["md_compares_py", "rules_py"]

M32 = 0xFFFFFFFF


def md_compares_py(md, op, n, nm1, narrow=False):
    """The compares of an operation against a record's metadata (``slot.md_compares``):
    ``md``, ``op`` as dicts of unsigned fields (tag: 34 bits two's complement)."""
    tag32 = md["tag"] & M32
    return {"late": int(due_reached_py(op["ts"], md["due"])), "complete": md["complete"],
            "eq_seqm": int(tag32 == op["seqm"] & M32), "eq_seq": int(tag32 == op["seq"]),
            "lt": int(seq_at_or_behind_py(tag32, op["seq"])), "cnt1_n": int(md["count"] == nm1),
            "cnt0": int(md["count"] == 0), "cnt_lt_n": int(md["count"] < n),
            "nelem_ne": int(op["nelem"] >> 2 * narrow != md["nelem"] >> 2 * narrow),
            "width_ne": int(narrow and (op["nelem"] & 3) != (md["nelem"] & 3))}


def _s8(v):
    return v - 256 if v & 128 else v


def rules_py(q, op, md, duplicate_check=True):
    """P1b's rules (``c``) from the compares in use ``q``, the operation and the record's
    metadata, as the model's ``_on_data`` orders them: expire before reuse, reuse waits
    while the record's last result is pending, join, duplicate, stale, out of window."""
    pkt = op["kind"] == OpKind.PKT.value
    pkt_ok = q["pkt"] and q["src_ok"]
    expire = q["may_expire"] and not q["complete"] and q["late"]
    k_reuse = pkt_ok and (q["complete"] or expire) and q["eq_seqm"]
    defer = k_reuse and q["nelem_nz"] and (expire or q["pend"])
    reuse = k_reuse and not defer
    join = pkt_ok and not defer and (k_reuse or q["eq_seq"])
    early_ok = op["reason"] in (Reason.OK.value, Reason.BIG_NELEM.value)
    c = {"defer": defer, "expire": expire, "reuse": reuse, "join": join,
         "cur_complete": (q["complete"] or expire) and not reuse,
         "dup": duplicate_check and (md["bitmap"] >> (op["worker"] & 31)) & 1,
         "nelem_ne": q["nelem_ne"], "one_n": q["one_n"], "cnt1_n": q["cnt1_n"],
         "opens": reuse or q["cnt0"],
         "new_exp": reuse or _s8(op["exp"]) > _s8(md["exponent"]),
         "stale": pkt_ok and not join and q["lt"],
         "oow": pkt_ok and not join and not q["lt"] and not defer,
         "unksrc": pkt and (op["reason"] == Reason.UNKNOWN_SOURCE.value
                            or (early_ok and not q["src_ok"])),
         "bignelem": pkt and op["reason"] == Reason.BIG_NELEM.value and q["src_ok"],
         "pkt": pkt, "scan": op["kind"] == OpKind.SCAN.value and q["enable"],
         "init": op["kind"] == OpKind.INIT.value, "pkt_ok": pkt_ok, "cnt_lt_n": q["cnt_lt_n"],
         # a spine's (CoreParams.tree): 0 on a core without the option, which is what the
         # stage benches build; the spine is checked whole (tb_core.test_tree_spine)
         "badcount": 0, "wc_lt_t": 0, "wc1_lt_t": 0, "cov_lt_t": 0,
         "width_ne": q["width_ne"],
         # a leaf's (CoreParams.leaf, hw/ina/leaf.py): 0 on a core without the option;
         # the leaf is checked whole (tb_core.test_tree_leaf)
         **dict.fromkeys(LEAF_RULES, 0)}
    return {k: int(bool(v)) for k, v in c.items()}


def _mask(v, bits):
    return v & ((1 << bits) - 1)


def effects_py(P, v, op, c, md, bit, cnt1, due, init_tag, job):
    """P2's effects (``slot_effects``): the metadata write, the requests and the counter
    events of a valid operation (``v``: valid and not to be re-run), unsigned fields."""
    from ina_fabric.hw.ina.layout import AccMode
    is_pkt, is_init = v and c["pkt"], v and c["init"]
    expired = v and c["expire"]
    reuse = c["reuse"]
    isdup = not reuse and c["dup"]
    nelem_bad = not reuse and c["nelem_ne"]
    join, cc = c["join"], c["cur_complete"]
    resend_ = join and cc
    dup_only = join and not cc and isdup
    malf3 = join and not cc and not isdup and nelem_bad
    accept = join and not cc and not isdup and not nelem_bad and \
        not (not reuse and c.get("width_ne", 0))
    completes = accept and (c["one_n"] if reuse else c["cnt1_n"])
    cur_bitmap = 0 if reuse else md["bitmap"]
    cur_count = 0 if reuse else md["count"]
    cur_exp = 0x80 if reuse else md["exponent"]
    cur_nelem = op["nelem"] if reuse else md["nelem"]
    cur_tag = op["seq"] if reuse else md["tag"]
    new_count = 1 if reuse else cnt1
    new_exp = op["exp"] if c["new_exp"] else md["exponent"]
    if is_init:
        w3 = {"en": 1, "addr": op["rec"], "data": {"tag": init_tag, "complete": 1,
                                                   "bitmap": 0, "count": 0, "exponent": 0x80,
                                                   "due": 0, "nelem": 0}}
    else:
        w3 = {"en": int(v), "addr": op["rec"], "data": {
            "tag": cur_tag, "complete": int((not reuse and (md["complete"] or c["expire"]))
                                            or completes),
            "bitmap": cur_bitmap | (bit if accept else 0),
            "count": new_count if accept else cur_count,
            "exponent": new_exp if accept else cur_exp,
            "due": due if reuse else md["due"], "nelem": cur_nelem}}
    a = {"rec": op["rec"], "job": job, "unicast": 0, "worker": 0, "seq": _mask(md["tag"], 32),
         "count": md["count"], "bitmap": md["bitmap"], "exponent": md["exponent"],
         "nelem": md["nelem"], "partial": 1}
    bq = {"rec": op["rec"], "job": job, "unicast": int(resend_), "worker": op["worker"] & 31,
          "seq": _mask(cur_tag, 32), "count": new_count if completes else cur_count,
          "bitmap": (cur_bitmap | bit) if completes else cur_bitmap,
          "exponent": new_exp if completes else cur_exp, "nelem": cur_nelem,
          "partial": 0 if completes else c["cnt_lt_n"]}
    resend = v and resend_
    r = op["reason"]
    ev = {"rx": [is_pkt and not c["defer"]], "rx_data": [v and c["pkt_ok"] and not c["defer"]],
          "drop_truncated": [is_pkt and r == Reason.TRUNCATED.value],
          "drop_bad_version": [is_pkt and r == Reason.BAD_VERSION.value],
          "drop_malformed": [is_pkt and r == Reason.MALFORMED.value, v and c["bignelem"],
                             v and malf3],
          "drop_unknown_job": [is_pkt and r == Reason.UNKNOWN_JOB.value],
          "drop_bad_session": [is_pkt and r == Reason.BAD_SESSION.value],
          "drop_unknown_source": [v and c["unksrc"]], "drop_stale": [v and c["stale"]],
          "drop_out_of_window": [v and c["oow"]],
          "duplicates": [resend and isdup, v and dup_only], "late": [resend and not isdup],
          "resent": [resend], "accepted": [v and accept], "results": [expired, v and completes],
          "partials": [expired]}
    events = {k: sum(int(bool(x)) << n for n, x in enumerate(bits)) for k, bits in ev.items()}
    mode = (AccMode.OPEN if c["opens"] else AccMode.ADD) if accept else AccMode.NONE
    return {"w3": w3, "push_a": int(bool(expired)), "a": a,
            "push_b": int(bool(v and (resend_ or completes))), "b": bq, "events": events,
            "accepted": int(bool(v and accept)) << job,
            "elem_start": int(bool(is_pkt and not (v and c["defer"]))), "mode": mode.value}
