"""Experiments and their analysis, beside the benches that run them (``ina bench control``,
``ina bench schedule``, ``ina control sim|trace|real|kappa2``, ``ina schedule
sweep-memory|train``): none of this is imported by a training run.

``contention`` (bandwidth traces from background jobs), ``simulate`` (the paper-scale
simulator), ``progress`` (the fitted progress model), ``realrun`` (the controller in real
training on loopback), ``labrun`` / ``labexp`` (the same on the namespace lab, and its
analysis), ``experiments`` (the simulated and real comparisons and their figures);
``schedule``: the WAN schedule's memory sweep and training comparison (behind ``ina
schedule sweep-memory|train`` and ``ina bench schedule``).
The controller itself (knobs, measurements, cost model, controllers, compression) stays in
``ina_fabric.host.controller``. See docs/control.md.
"""
