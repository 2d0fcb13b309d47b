"""``ina bench allreduce``'s backend row: it reads ``bench_backend.measure``'s result (a
dict since that bench's rewrite; the allreduce bench unpacked it as a 4-tuple and every
run without ``--no-backend`` ended in a ValueError after its table)."""

import math

from ina_fabric.bench.bench_allreduce import backend_row
from ina_fabric.bench.bench_backend import measure


def test_the_backend_row_comes_from_the_backend_benchs_measurement():
    res = measure(2, 256 << 10, 2)
    row = backend_row(res)
    assert row["workers"] == 2 and row["size"] == "256KB" and row["path"] == "backend"
    assert row["backend_ms"] == res["ina_ms"] > 0
    assert row["raw_client_ms"] == res["raw_client_ms"] > 0
    assert math.isclose(row["overhead"], row["backend_ms"] / row["raw_client_ms"] - 1)
    assert row["checked"] is True
