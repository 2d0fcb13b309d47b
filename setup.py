"""Build of the compiled data path (everything else is in pyproject.toml).

The C extensions are optional: without a C compiler the install still succeeds, and the
software switch and the client say once, at start, that they run the slower pure-Python
path (``ina_fabric.host.switch.fast.WHY_NOT`` and ``ina_fabric.host.transport.fastcall`` say why).
"""

from setuptools import Extension, setup

# no errno from math functions, no FP traps: lets the element loops vectorize; IEEE
# results are unchanged (no -ffast-math: the rounding and clamping must stay exact)
FLAGS = ["-O3", "-std=c11", "-Wall", "-Wno-unused-function", "-fno-math-errno",
         "-fno-trapping-math"]

EXTENSIONS = [
    # the switch's data path: recvmmsg batches, slot rules, exact accumulation, sendmmsg
    Extension("ina_fabric.host.switch._engine", ["host/switch/_engine.c"],
              include_dirs=["ina_fabric/protocol"], depends=["ina_fabric/protocol/ina_wire.h", "ina_fabric/protocol/ina_counters.h",
                                                "host/transport/ina_gso.h"],
              extra_compile_args=FLAGS, optional=True),
    # the worker's call loop: the send window, packets built in a ring, fused dequantize
    Extension("ina_fabric.host.transport._client", ["host/transport/_client.c"],
              include_dirs=["ina_fabric/protocol"],
              depends=["ina_fabric/protocol/ina_wire.h", "host/transport/ina_gso.h"],
              extra_compile_args=FLAGS, optional=True),
]

setup(ext_modules=EXTENSIONS)
