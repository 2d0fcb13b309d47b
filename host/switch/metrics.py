"""A running switch's counters and jobs, for people and for Prometheus, read from STATUS.

Both watchers read the switch the way any client does: the authenticated, paged STATUS
(``ina_fabric.protocol.control_client.query_status``), so they work for every engine and
for the board alike, and never touch the switch's state from another thread.

* :class:`StatusCollector`: a ``prometheus_client`` collector; each scrape is one STATUS
  read. ``ina switch --metrics PORT`` serves it over HTTP (:func:`serve_metrics`):
  ``ina_switch_<counter>_total`` for every counter (help text: what it counts,
  ``ina_fabric.protocol.counters``); per job (label ``job``) every counter the switch
  keeps per job, ``ina_job_<counter>_total`` (``JOB_COUNTERS``; zero where STATUS leaves
  it out, absent where the switch keeps none per job: the board), and its workers, window,
  elements, deadline, open slots, the number of workers the oldest open slot waits for
  (``ina_job_waiting_for``, one series per missing worker in ``ina_job_waiting_for_worker``)
  and its position (the next sequence number a run resumes at). ``ina_switch_up`` is 0
  when the switch did not answer. Each scrape counts one ``status_requests``.
* :func:`snapshot` / :func:`rates`: what ``ina top`` draws: counter rates between two
  reads, and the jobs.

The switch's counters cover all jobs and everything before a datagram's job is known;
the per-job counters are each job's share (the model and the C engine keep them; the
gateware does not, so a board serves its counters switch-wide only).
"""

import time

from ina_fabric.protocol.control_client import query_status
from ina_fabric.protocol.counters import DOCS, JOB_COUNTERS

__all__ = ["StatusCollector", "serve_metrics", "snapshot", "rates", "JOB_GAUGES"]

#: per-job figures of STATUS served as gauges: name -> (STATUS key, help, scale)
JOB_GAUGES = {
    "ina_job_workers": ("workers", "workers in the job", 1),
    "ina_job_window": ("window", "the job's window (slots in flight)", 1),
    "ina_job_elements": ("elements", "int32 elements per packet", 1),
    "ina_job_deadline_seconds": ("deadline_ms", "bounded mode's slot deadline", 1e-3),
    "ina_job_open_slots": ("open_slots", "slots open now", 1),
    "ina_job_position": ("position", "the next sequence number a run resumes at", 1),
}


def snapshot(addr, key=None, timeout=1.0) -> dict:
    """One STATUS read, stamped: {"t": monotonic seconds, "counters", "jobs"}."""
    doc = query_status(addr, timeout=timeout, key=key)
    return {"t": time.monotonic(), "counters": doc.get("counters", {}),
            "jobs": doc.get("jobs", {})}


def rates(before: dict, after: dict) -> dict:
    """Counter rates (per second) between two snapshots."""
    dt = after["t"] - before["t"]
    if dt <= 0:
        return {k: 0.0 for k in after["counters"]}
    return {k: (v - before["counters"].get(k, 0)) / dt for k, v in after["counters"].items()}


class StatusCollector:
    """A ``prometheus_client`` collector for the switch at ``addr`` (ip, port)."""

    def __init__(self, addr, key=None, timeout=1.0):
        self.addr, self.key, self.timeout = addr, key, timeout

    def describe(self):
        return []       # metrics depend on what the switch reports: no fixed description

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        up = GaugeMetricFamily("ina_switch_up", "1 if the switch answered STATUS")
        try:
            doc = query_status(self.addr, timeout=self.timeout, key=self.key)
        except (OSError, ValueError):
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        for name, value in sorted(doc.get("counters", {}).items()):
            c = CounterMetricFamily(f"ina_switch_{name}", DOCS.get(name, name))
            c.add_metric([], value)
            yield c
        jobs = doc.get("jobs", {})
        for metric, (field, help_, scale) in JOB_GAUGES.items():
            g = GaugeMetricFamily(metric, help_, labels=["job"])
            for job, st in sorted(jobs.items(), key=lambda kv: int(kv[0])):
                if field in st:
                    g.add_metric([str(job)], float(st[field]) * scale)
            yield g
        yield from self._job_counters(jobs)
        w = GaugeMetricFamily("ina_job_waiting_for", "workers the oldest open slot still "
                              "lacks (a stalled job: who stalls it)", labels=["job"])
        ww = GaugeMetricFamily("ina_job_waiting_for_worker", "1 for each worker the oldest "
                               "open slot still lacks", labels=["job", "worker"])
        for job, st in sorted(jobs.items(), key=lambda kv: int(kv[0])):
            missing = st.get("waiting_for", [])
            w.add_metric([str(job)], len(missing))
            for worker in missing:
                ww.add_metric([str(job), str(worker)], 1)
        yield w
        yield ww

    @staticmethod
    def _job_counters(jobs):
        """``ina_job_<counter>_total{job}`` for each per-job counter, for every job whose
        STATUS entry carries its counters (STATUS lists those not zero)."""
        from prometheus_client.core import CounterMetricFamily
        kept = {job: st["counters"] for job, st in jobs.items()
                if isinstance(st.get("counters"), dict)}
        for name in JOB_COUNTERS:
            c = CounterMetricFamily(f"ina_job_{name}", f"{DOCS[name]}, this job's",
                                    labels=["job"])
            for job, counts in sorted(kept.items(), key=lambda kv: int(kv[0])):
                c.add_metric([str(job)], counts.get(name, 0))
            yield c


def serve_metrics(addr, port: int, host: str = "127.0.0.1", key=None):
    """Serve :class:`StatusCollector` for the switch at ``addr`` on http://host:port/
    (any path; ``/metrics`` by convention). Returns the HTTP server (``shutdown()``
    stops it) and its port (the one bound when ``port`` is 0)."""
    from prometheus_client import CollectorRegistry, start_http_server
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(addr, key))
    server, _ = start_http_server(port, host, registry)
    return server, server.server_address[1]
