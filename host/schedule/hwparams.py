"""The default FPGA memory M: what our gateware reports for a chosen configuration.

``hw/ina/params.py`` (plain Python, no Amaranth) defines ``CoreParams`` with
``slot_memory_bytes``.  We take its default core (32 workers and the gateware's default
window W, elements per packet E, lanes L) as the reference board.  The slot window (the
state a job needs with zero skew, one set of W slots of E int32) comes from the same
object.  If the module is missing, a documented fallback is used and the note says so.
"""

__all__ = ["default_memory", "job_shape", "FALLBACK_MEMORY_BYTES"]

FALLBACK_MEMORY_BYTES = 10_000


def default_memory() -> tuple[float, float, str]:
    """``(M bytes, slot-window bytes, note)``."""
    try:
        from ina_fabric.hw.ina.params import CoreParams
    except ImportError as e:  # pragma: no cover - only before the gateware lands
        return (float(FALLBACK_MEMORY_BYTES), 2048.0,
                f"ina_fabric.hw.ina.params not importable ({e}); fallback M = {FALLBACK_MEMORY_BYTES} B")
    p = CoreParams(workers=32)
    window = p.window * p.elements * 4
    return (float(p.slot_memory_bytes), float(window),
            f"M from ina_fabric.hw.ina.params.CoreParams(workers=32): {p.describe()}")


def job_shape() -> tuple[int, int]:
    """``(window W, elements E)`` for the edge-FPGA job entries of the schedule JSON."""
    try:
        from ina_fabric.hw.ina.params import CoreParams
    except ImportError:  # pragma: no cover
        return 8, 64
    p = CoreParams(workers=32)
    return p.window, p.elements
