"""Every counter a switch keeps, defined once: its name, who keeps it, what it counts.

Three places used to write these names by hand (the reference model's ``COUNTERS``, the
register map's ``COUNTER_NAMES``, the C engine's enum); now each is derived from
:data:`TABLE`:

* the reference model (``host/switch/model.py``): :data:`MODEL_COUNTERS`, in table order;
* the C engine (``host/switch/_engine.c``): :data:`ENGINE_COUNTERS`, through the generated
  ``ina_counters.h`` (an enum ``C_<NAME>`` and the names array, in table order);
  ``python -m ina_fabric.protocol.counters`` writes it, and a test checks that the file
  on disk is what the table generates;
* the register map (``regs.COUNTER_NAMES``, hence the gateware's counter block and its
  decoder): :data:`GATEWARE_COUNTERS`, ordered by ``register`` (the offset from
  ``regs.COUNTER_BASE``; an address never moves once the gateware has it).

A counter kept by several agrees between them: the C engine and the RTL core are tested
differentially against the model, counter by counter. ``ina switch --metrics`` serves
each under its own name with the doc below as its help text.
"""

from dataclasses import dataclass
import pathlib

__all__ = ["CounterDef", "TABLE", "MODEL", "ENGINE", "GATEWARE", "MODEL_COUNTERS",
           "ENGINE_COUNTERS", "GATEWARE_COUNTERS", "ANSWER_COUNTERS", "JOB_COUNTERS", "DOCS",
           "c_header",
           "C_HEADER_PATH"]

MODEL, ENGINE, GATEWARE = "model", "engine", "gateware"


@dataclass(frozen=True)
class CounterDef:
    name: str
    kept_by: tuple          # of MODEL, ENGINE, GATEWARE
    doc: str
    register: int | None = None     # offset from regs.COUNTER_BASE (GATEWARE only)


M, E, G = MODEL, ENGINE, GATEWARE
#: the one list (model order first: STATUS lists the model's counters in this order)
TABLE = (
    CounterDef("rx", (M, E, G), "datagrams received", 0),
    CounterDef("rx_data", (M, E, G), "DATA datagrams received", 1),
    CounterDef("accepted", (M, E, G), "contributions summed into a slot", 2),
    CounterDef("duplicates", (M, E, G), "contributions already in their slot", 3),
    CounterDef("late", (M, E, G), "contributions to a slot already closed", 4),
    CounterDef("results", (M, E, G), "RESULT datagrams sent (complete or partial)", 5),
    CounterDef("partials", (M, E, G), "slots closed at their deadline without everyone", 6),
    CounterDef("overflows", (M, E, G), "sums that left the int32 range", 7),
    CounterDef("resent", (M, E, G), "stored RESULTs sent again to a worker that re-sent", 8),
    CounterDef("status_requests", (M, G), "STATUS_REQ datagrams answered", 9),
    CounterDef("status_unpadded", (M, G), "STATUS_REQ shorter than the reply (not answered)",
               19),
    CounterDef("control", (M, G), "CONTROL datagrams taken (jobs installed or removed)", 20),
    CounterDef("control_refused", (M, G), "CONTROL datagrams refused (reason in the reply)",
               21),
    CounterDef("drop_unauthenticated", (M, G), "CONTROL/STATUS_REQ with a bad tag or nonce",
               22),
    CounterDef("drop_truncated", (M, E, G), "datagrams shorter than the header", 10),
    CounterDef("drop_malformed", (M, E, G), "datagrams whose length disagrees with nelem",
               11),
    CounterDef("drop_bad_version", (M, G), "datagrams of another protocol version", 12),
    CounterDef("drop_unknown_job", (M, E, G), "DATA for a job not in the table", 13),
    CounterDef("drop_unknown_source", (M, E, G), "DATA from an address not in the job", 14),
    CounterDef("drop_bad_session", (M, E, G), "DATA carrying another run's session id", 15),
    CounterDef("drop_stale", (M, E, G), "DATA for a sequence number the slot has left", 16),
    CounterDef("drop_out_of_window", (M, E, G), "DATA beyond the job's window", 17),
    CounterDef("skipped", (M, E), "bounded-skip: slots closed early without an absent "
               "worker"),
    # trees of switches (docs/fabric.md)
    CounterDef("up", (M, E), "partial sums sent to the parent switch"),
    CounterDef("up_resent", (M, E), "partial sums sent to the parent again, on a member's "
               "re-send"),
    CounterDef("relayed", (M, E), "RESULTs from the parent relayed to the job's members"),
    CounterDef("drop_result", (M, E), "RESULTs no slot awaited"),
    CounterDef("drop_bad_width", (M, E), "DATA whose element width is not its slot's "
               "(docs/precision.md)"),
    # the shared slot pool (docs/pool.md)
    CounterDef("overflow", (M, E), "DATA sent on to the parent switch (FORWARDED): no pool "
               "slot was free"),
    CounterDef("overflow_in", (M, E), "FORWARDED DATA taken from a child switch whose pool "
               "was full"),
    CounterDef("congested", (M, E), "RESULTs sent with CONGESTED (the slot pool was full)"),
    CounterDef("errors_sent", (M, E, G), "ERROR replies to DATA dropped for a fixable reason",
               24),
    CounterDef("errors_limited", (M, E, G), "ERROR replies not sent (that source was "
               "answered within ERROR_INTERVAL)", 25),
    # the gateware's own
    CounterDef("stream_errors", (G,), "streams whose beat count disagrees with their "
               "length", 18),
    CounterDef("drop_control_busy", (G,), "CONTROL that came while the control plane was "
               "busy with one", 23),
    # the C engine's own (not the model's semantics: its batching and pacing)
    CounterDef("send_errors", (E,), "sendmmsg failures"),
    CounterDef("rx_batches", (E,), "recvmmsg batches"),
    CounterDef("tx_batches", (E,), "sendmmsg batches"),
    CounterDef("pace_held", (E,), "RESULTs held back by the per-destination pacer"),
)
del M, E, G

MODEL_COUNTERS = tuple(c.name for c in TABLE if MODEL in c.kept_by)
ENGINE_COUNTERS = tuple(c.name for c in TABLE if ENGINE in c.kept_by)
GATEWARE_COUNTERS = tuple(c.name for c in sorted((c for c in TABLE if GATEWARE in c.kept_by),
                                                 key=lambda c: c.register))
#: the counters a switch also keeps per job (STATUS's ``jobs[id]["counters"]``, ``ina
#: switch --metrics``'s ``ina_job_<name>_total{job=...}``): those counted once a
#: datagram's job is found, and for its slots' results; the rest (``rx``, drops before
#: the job is known, CONTROL and STATUS, refusals, the engine's batching) are the
#: switch's alone. The model and the C engine keep them, tested differentially.
JOB_COUNTERS = ("rx_data", "accepted", "duplicates", "late", "results", "partials",
                "overflows", "resent", "skipped", "up", "up_resent", "relayed", "drop_result",
                "drop_unknown_source", "drop_bad_session", "drop_stale", "drop_out_of_window",
                "drop_malformed", "overflow", "overflow_in", "congested", "drop_bad_width")
#: the counters of a switch that answers refused DATA (every engine: the model's
#: ``answers=False`` leaves them out)
ANSWER_COUNTERS = ("errors_sent", "errors_limited")
#: name -> what it counts
DOCS = {c.name: c.doc for c in TABLE}

C_HEADER_PATH = pathlib.Path(__file__).with_name("ina_counters.h")


def _check():
    names = [c.name for c in TABLE]
    if len(set(names)) != len(names):
        raise ValueError("counters: a name appears twice")
    regs = [c.register for c in TABLE if GATEWARE in c.kept_by]
    if sorted(regs) != list(range(len(regs))):
        raise ValueError("counters: gateware registers must be 0..n-1, each once")
    if any(c.register is not None and GATEWARE not in c.kept_by for c in TABLE):
        raise ValueError("counters: only a gateware counter has a register")
    if not set(JOB_COUNTERS) <= set(MODEL_COUNTERS) & set(ENGINE_COUNTERS):
        raise ValueError("counters: a per-job counter must be the model's and the engine's")


_check()


def c_header() -> str:
    """``ina_counters.h``: the C engine's counters (enum and names), from :data:`TABLE`."""
    enum = ",\n    ".join(f"C_{n.upper()}" for n in ENGINE_COUNTERS)
    names = ",\n    ".join(f'"{n}"' for n in ENGINE_COUNTERS)
    return ("/* Generated by `python -m ina_fabric.protocol.counters` from\n"
            " * ina_fabric/protocol/counters.py (TABLE): do not edit. */\n"
            "#ifndef INA_COUNTERS_H\n#define INA_COUNTERS_H\n\n"
            f"enum {{\n    {enum},\n    NCOUNTERS\n}};\n\n"
            f"static const char *COUNTER_NAMES[NCOUNTERS] = {{\n    {names},\n}};\n\n"
            "#endif\n")


if __name__ == "__main__":
    C_HEADER_PATH.write_text(c_header())
    print(f"wrote {C_HEADER_PATH}")
