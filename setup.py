"""Build of the compiled data path (everything else is in pyproject.toml).

The C extensions are optional: without a C compiler the install still succeeds, and the
software switch and the client say once, at start, that they run the slower pure-Python
path (``ina_fabric.host.fastpath.engine_status()`` tells why).
"""

from setuptools import Extension, setup

FLAGS = ["-O3", "-std=c11", "-Wall", "-Wno-unused-function"]

EXTENSIONS = [
    # the switch's data path: recvmmsg batches, slot rules, exact accumulation, sendmmsg
    Extension("ina_fabric.host.switch._engine", ["host/switch/_engine.c"],
              extra_compile_args=FLAGS, optional=True),
]

setup(ext_modules=EXTENSIONS)
