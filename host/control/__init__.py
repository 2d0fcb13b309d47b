"""Joint network/ML controller: gradient precision and accumulation chosen together.

``knobs`` (what can be turned), ``measure`` (online measurements), ``costmodel`` (predicted
time to target per knob setting), ``controllers`` (Static, Precision-only,
Accumulation-only, Decoupled, Joint), ``compress`` (precision that really changes the
bytes on the wire). The experiments that evaluate it (simulator, background contention,
real and lab runs, analysis) live beside the benches, in ``ina_fabric.bench.experiments``.
See docs/control.md.
"""
