"""INA-Fabric: in-network gradient aggregation.

One import namespace, four parts. The source folders keep the layout of the repository
(``hw/``, ``host/``, ``sim/``, ``bench/``, ``constraints/`` at the top level); the
package maps them here (``[tool.setuptools.package-dir]`` in pyproject.toml):

- :mod:`ina_fabric.protocol`: what both sides share, defined once: the wire format, the
  job-table entry, the register table. Neither ``hw`` nor ``host`` is imported by it.
- :mod:`ina_fabric.hw`: the Amaranth gateware (imports ``protocol``, never ``host``).
- :mod:`ina_fabric.host`: the host runtime, the reference model, the ``ina`` command.
- :mod:`ina_fabric.sim`: the cocotb benches that check ``hw`` against the model.
- :mod:`ina_fabric.bench`: the benchmark suite behind ``ina bench``.
- :mod:`ina_fabric.constraints`: board constraint files (package data).

Run from a source checkout without installing (``PYTHONPATH=.``), the sibling folders are
found through this package's ``__path__``; an installed copy has them inside it.
"""

import pathlib as _pathlib

__version__ = "0.1.0"

_checkout = _pathlib.Path(__file__).resolve().parent.parent
if (_checkout / "pyproject.toml").is_file() and (_checkout / "hw" / "ina").is_dir():
    __path__.append(str(_checkout))  # noqa: F821 (a package's __path__)
