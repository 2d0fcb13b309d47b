"""`ina bench lab-allreduce` end to end on a 2-host rack: Gloo in each host namespace,
our switch in the switch namespace, results checked against each other, and the JSON
row has the fields the issue names. Needs root; about 15 s."""

import json

import pytest


def _two_host_row(tmp_path, lab_bench, prefix, *flags):
    """`ina bench lab-allreduce` on 2 hosts, one 4 MB call of each backend, with
    ``flags``; its one row, checked: every result within its bound."""
    from ina_fabric.bench import bench_lab_allreduce as B
    rc = B.main(["--hosts", "2", "--sizes", "4MB", "--reps", "1", *flags,
                 "--id", lab_bench(prefix)])
    assert rc == 0
    row, = json.loads((tmp_path / "lab_allreduce.json").read_text())["figures"]["rows"]
    assert row["checked"] and row["worst_error_over_bound"] <= 1.0, row
    return row


@pytest.mark.slow
@pytest.mark.xdist_group("lab")
def test_lab_allreduce_bench_runs_and_checks(tmp_path, lab_bench):
    from ina_fabric.bench import bench_lab_allreduce as B
    rc = B.main(["--hosts", "2", "--sizes", "4MB", "--reps", "1", "--rate", "100mbit",
                 "--id", lab_bench("tb")])
    assert rc == 0
    doc = json.loads((tmp_path / "lab_allreduce.json").read_text())
    row, = doc["figures"]["rows"]
    # the machine's load at the end of the run: 1, 5 and 15 minutes
    assert len(doc["load_average"]) == 3 and all(x >= 0 for x in doc["load_average"])
    for key in ("hosts", "size", "rate_mbit", "gloo_over_ina_median", "limit"):
        assert key in row
    assert (row["hosts"], row["size"], row["rate_mbit"], row["limit"]) == (2, 4 << 20, 100.0, 1.0)
    assert row["checked"] and row["worst_error_over_bound"] <= 1.0
    assert row["gloo_over_ina_median"] > 0
    # RESULTs 0.66 ms apart at 100 Mbit/s: a wait for a batch would catch none, and the
    # worker seldom waits (window.COALESCE_GAPS; 2 calls of 512 RESULTs each: before
    # that rule it waited after nearly every one, and woke twice per RESULT)
    assert row["coalesced_waits"] < 100, row


@pytest.mark.slow
@pytest.mark.xdist_group("lab")
def test_a_worker_reads_results_in_batches_on_a_fast_link(tmp_path, lab_bench, monkeypatch):
    """At 1 Gbit/s a window of 64 jumbo datagrams stands in the tbf queue (the workers
    may keep it all there: INA_LOCAL_QUEUE) and RESULTs come 66 us apart: the worker
    waits for a few at a time (window.COALESCE_*) instead of waking for each, and the
    results are still within the bound. With TCP's share of the queue (the default,
    sockbuf.local_queue_bytes) a queue of 2 ms of the rate stands, and the waits come and
    go with the machine's load: 0-136 in 4-host runs, 3-16 with 2 hosts."""
    monkeypatch.setenv("INA_LOCAL_QUEUE", str(8 << 20))
    row = _two_host_row(tmp_path, lab_bench, "tc", "--rate", "1gbit")
    assert row["coalesced_waits"] > 50, row


@pytest.mark.slow
@pytest.mark.xdist_group("lab")
def test_a_full_host_queue_delays_datagrams_and_loses_none(tmp_path, lab_bench):
    """A worker with 4 MB in flight on a 20 Mbit/s link whose own tbf queue holds about
    one jumbo datagram past its bucket: the host's queue refuses most sends (ENOBUFS,
    reported because the socket has IP_RECVERR), and the worker sends each again a moment
    later, as TCP does on local congestion. Before, those datagrams vanished in the
    host's own queue and came back only as timer re-sends (709 of them in this run, and
    the call 15% slower)."""
    row = _two_host_row(tmp_path, lab_bench, "tq", "--rate", "20mbit", "--queue-ms", "1",
                        "--inflight", str(4 << 20), "--window", "1024")
    assert row["local_retries"] > 0 and row["retransmits"] == 0, row


@pytest.mark.slow
@pytest.mark.xdist_group("lab")
@pytest.mark.parametrize("engine", ["c", "python"])
def test_a_worker_keeps_to_its_share_of_its_hosts_queue(tmp_path, lab_bench, monkeypatch,
                                                          engine):
    """1 MB in flight on a quiet 100 Mbit/s link whose own tbf queue holds 20 ms (250 KB):
    the worker's send buffer (sockbuf.local_queue_bytes, 128 KB) stops it before it fills
    that queue, so its host refuses none of its sends; it waits for the queue instead
    (local_waits). Before, with an 8 MB send buffer, its whole window went into the queue,
    which refused sends (1,564 in this test; 1-31 per 4.5 MB call in the flood probe's
    quiet runs) and halved the window each time; beside a UDP flood it lost its place in
    the queue (issue 39)."""
    monkeypatch.setenv("INA_ENGINE", engine)
    row = _two_host_row(tmp_path, lab_bench, "tw", "--rate", "100mbit", "--queue-ms", "20",
                        "--inflight", str(1 << 20), "--window", "1024")
    assert row["local_retries"] == 0 and row["local_waits"] > 0, row


@pytest.mark.slow
@pytest.mark.xdist_group("lab")
def test_train_through_the_lab(tmp_path, lab_bench):
    """`ina train --lab rack`: one torchrun per host namespace (--nnodes 2), the DDP hook
    through the lab's switch; reaches the target with identical replicas; no lab left."""
    import subprocess
    import sys
    from ina_fabric.host.lab import list_labs
    r = subprocess.run([sys.executable, "-m", "ina_fabric.host.cli", "train", "--lab", "rack",
                        "--workers", "2", "--backends", "ina", "--no-progress", "--out",
                        str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads((tmp_path / "results.json").read_text())["ina"]
    assert res["time_to_accuracy"] is not None
    assert len(set(res["param_hashes"])) == 1 and res["fallbacks"] == 0
    assert "lab train" in r.stderr and "train" not in list_labs()


@pytest.mark.slow
@pytest.mark.xdist_group("lab")
def test_fairness_bench_runs_two_jobs_beside_tcp(tmp_path, lab_bench):
    """`ina bench fairness`: two ina jobs and two bulk TCP flows at once on a 3-host rack
    lab, every job's ranks bitwise equal, and the row has Jain's index over the jobs and
    the flows with each share normalized by what it got alone."""
    from ina_fabric.bench import bench_fairness as B
    rc = B.main(["--workers", "3", "--reps", "1", "--seconds", "3", "--startup", "12",
                 "--backends", "ina", "--id", lab_bench("tf")])
    assert rc == 0
    doc = json.loads((tmp_path / "fairness.json").read_text())["figures"]
    row, = doc["rows"]
    assert row["backend"] == "ina" and (row["jobs"], row["flows"]) == (2, 2)
    assert row["exact"] and 0.25 <= row["jain"]["median"] <= 1.0
    run = doc["runs"][0]["ina"]
    assert len(run["job_share"]) == 2 and len(run["tcp_share"]) == 2
    assert all(j["calls"] > 0 for j in run["jobs"].values())
    assert all(s > 0 for s in run["job_share"] + run["tcp_share"])
