"""``ina lab``: clusters and WANs emulated in network namespaces, so every comparison
(ours and Gloo's) runs on the same shaped links.

- :mod:`.topology`: topologies from TOML (``rack`` built in), rates, the 198.18.0.0/15 plan.
- :mod:`.netns`: namespaces, veths, bridges, addresses and tbf through pyroute2;
  processes inside namespaces.
- :mod:`.lab`: :class:`Lab` (build, run, services, context manager) and :func:`down`.
- :mod:`.delayline`: the userspace delay line (delay, jitter, loss) between two TAPs.
- :mod:`.probe`: TCP throughput and UDP round-trip probes run inside a lab.
"""

from .lab import Lab, LabError, down, down_all, list_labs, load_state, training_lab
from .netns import available
from .topology import Topology, TopologyError, load, parse_rate, format_rate

__all__ = ["Lab", "LabError", "down", "down_all", "list_labs", "load_state", "training_lab",
           "available",
           "Topology", "TopologyError", "load", "parse_rate", "format_rate"]
