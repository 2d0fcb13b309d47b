"""DoubleZero end to end on the ``wan9`` lab: islands with an edge aggregator (``ina
switch``) and an edge replicator each, the runtime that follows an exported schedule,
and the baselines (Gloo ring over the same WAN, colocated). See docs/wan.md."""
