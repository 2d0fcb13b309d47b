"""WAN schedule optimizer: topology and geography (``topology``, ``cities``), the round
model with mixing matrices and sigma2 (``model``), the optimizer (``search``), the
discrete-event simulator (``simulate``), decentralized training (``train``), all-reduce
baselines, export for the host runtime and figures.  See docs/schedule.md."""
