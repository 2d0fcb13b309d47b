"""Python models of the header pipeline's stages (hw/ina/slot_*.py), written from the
module docstrings and the model's rules (``host/switch/model.py``), for the stage
benches: what each stage registers from its inputs."""

from ina_fabric.hw.ina.layout import OpKind, Reason
from ina_fabric.hw.ina.slot import due_reached_py, seq_at_or_behind_py

__all__ = ["md_compares_py", "rules_py"]

M32 = 0xFFFFFFFF


def md_compares_py(md, op, n, nm1):
    """The compares of an operation against a record's metadata (``slot.md_compares``):
    ``md``, ``op`` as dicts of unsigned fields (tag: 34 bits two's complement)."""
    tag32 = md["tag"] & M32
    return {"late": int(due_reached_py(op["ts"], md["due"])), "complete": md["complete"],
            "eq_seqm": int(tag32 == op["seqm"] & M32), "eq_seq": int(tag32 == op["seq"]),
            "lt": int(seq_at_or_behind_py(tag32, op["seq"])), "cnt1_n": int(md["count"] == nm1),
            "cnt0": int(md["count"] == 0), "cnt_lt_n": int(md["count"] < n),
            "nelem_ne": int(op["nelem"] != md["nelem"])}


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
         "init": op["kind"] == OpKind.INIT.value, "pkt_ok": pkt_ok, "cnt_lt_n": q["cnt_lt_n"]}
    return {k: int(bool(v)) for k, v in c.items()}
