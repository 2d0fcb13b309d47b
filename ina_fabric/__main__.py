"""``python -m ina_fabric`` is the ``ina`` command."""

import sys

from ina_fabric.host.cli import main

sys.exit(main())
