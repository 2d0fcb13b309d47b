"""Joint network/ML controller: gradient precision and accumulation chosen together.

``knobs`` (what can be turned), ``measure`` (online measurements), ``costmodel`` (predicted
time to target per knob setting), ``controllers`` (Static, Precision-only,
Accumulation-only, Decoupled, Joint), ``contention`` (bandwidth traces from background
jobs), ``simulate`` (paper-scale simulator), ``compress`` (precision that really changes
the bytes on the wire), ``realrun`` (the controller in real training). See docs/control.md.
"""
