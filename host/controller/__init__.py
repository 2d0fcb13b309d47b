"""Joint network/ML controller: gradient precision and accumulation chosen together.

(The controller, not the switch's CONTROL plane: that is ``ina_fabric.protocol.auth``,
``control_client`` and the switch's job table. This package was ``host/control``.)

``knobs`` (what can be turned), ``measure`` (online measurements), ``costmodel`` (predicted
time to target per knob setting), ``controllers`` (Static, Precision-only,
Accumulation-only, Decoupled, Joint), ``compress`` (precision that really changes the
bytes on the wire). The experiments that evaluate it (simulator, background contention,
real and lab runs, analysis) live beside the benches, in ``ina_fabric.bench.experiments``.
See docs/control.md.
"""
