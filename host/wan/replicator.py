"""The edge replicator: the island's update leaves its host once; the copies for the
other islands of its group are made here, in the network (the stand-in for the edge
FPGA's replicator, as ``ina switch`` is the stand-in for its aggregator).

Group table: job -> [(destination aggregator, worker id)]. A DATA datagram from one of
the island's hosts under a job of the table is sent once to every destination, with the
``worker`` field rewritten to the id the sending island has in that destination's job
(each receiving edge numbers its inbound streams itself, so one copy cannot carry one id
for all). Nothing else is changed: job, seq, exponent and elements are the sender's.

With K > 1 hosts per island it also fans the island's aggregate out: a RESULT from the
island's own edge aggregator under one of the island's edge jobs (``results``: job ->
[host]) is copied, unchanged, to each of the island's hosts (the edge FPGA's multicast
of the RESULT; the aggregator itself has one result destination per job).

``EdgeReplicator.process(datagram, source)`` is pure (no sockets, no clock) and returns
``[(destination, bytes)]``; ``serve`` is the thin socket loop around it.

    python -m ina_fabric.host.wan.replicator --listen 198.18.3.254:47001 \\
        --schedule schedule.json --island "New York" --hosts 198.18.3.1:47000
"""

import argparse
from collections import Counter
import json
import signal
import socket
import sys

from ina_fabric.protocol.fields import HEADER_BYTES, VERSION, MsgType, field_offsets

__all__ = ["EdgeReplicator", "COUNTERS", "serve", "main"]

COUNTERS = ("rx", "copies", "result_rx", "result_copies", "drop_truncated",
            "drop_bad_version", "drop_not_data", "drop_unknown_job", "drop_unknown_source")
_OFF = field_offsets()
_JOB = slice(_OFF["job"], _OFF["job"] + 2)


class EdgeReplicator:
    """``table``: job -> [((ip, port), worker)]; ``sources``: the (ip, port) of the
    island's hosts, the only senders it replicates for; ``results``: job -> [(ip, port)]
    the RESULTs of the island's edge aggregator ``edge`` (the only source taken for
    them) are copied to."""

    def __init__(self, table: dict, sources, results=None, edge=None):
        self.table = {int(j): [(tuple(d), int(w)) for d, w in dests]
                      for j, dests in table.items()}
        for j, dests in self.table.items():
            if any(not 0 <= w < 255 for _, w in dests):
                raise ValueError(f"job {j}: worker ids must be 0..254")
        self.sources = {tuple(s) for s in sources}
        self.results = {int(j): [tuple(d) for d in dests]
                        for j, dests in (results or {}).items()}
        self.edge = tuple(edge) if edge else None
        self.counters = Counter({c: 0 for c in COUNTERS})

    def process(self, datagram: bytes, source) -> list:
        c = self.counters
        c["rx"] += 1
        if len(datagram) < HEADER_BYTES:
            c["drop_truncated"] += 1
            return []
        if datagram[_OFF["version"]] != VERSION:
            c["drop_bad_version"] += 1
            return []
        if datagram[_OFF["type"]] == MsgType.RESULT and self.results:
            dests = self.results.get(int.from_bytes(datagram[_JOB], "big"))
            if dests is None:
                c["drop_unknown_job"] += 1
                return []
            if tuple(source) != self.edge:
                c["drop_unknown_source"] += 1
                return []
            c["result_rx"] += 1
            c["result_copies"] += len(dests)
            return [(d, datagram) for d in dests]
        if datagram[_OFF["type"]] != MsgType.DATA:
            c["drop_not_data"] += 1
            return []
        dests = self.table.get(int.from_bytes(datagram[_JOB], "big"))
        if dests is None:
            c["drop_unknown_job"] += 1
            return []
        if tuple(source) not in self.sources:
            c["drop_unknown_source"] += 1
            return []
        out = []
        b = bytearray(datagram)
        for dest, worker in dests:
            b[_OFF["worker"]] = worker
            out.append((dest, bytes(b)))
        c["copies"] += len(out)
        return out


def serve(sock, model: EdgeReplicator, stop=lambda: False):
    """Receive, replicate, send, until ``stop()`` (checked every 0.2 s)."""
    sock.settimeout(0.2)
    buf = bytearray(65536)
    while not stop():
        try:
            n, src = sock.recvfrom_into(buf)
        except socket.timeout:
            continue
        for dest, data in model.process(bytes(buf[:n]), src):
            try:
                sock.sendto(data, dest)
            except OSError:
                model.counters["send_errors"] += 1


def _addr(text):
    ip, _, port = text.rpartition(":")
    return ip, int(port)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ina_fabric.host.wan.replicator",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", required=True, metavar="IP:PORT")
    ap.add_argument("--schedule", required=True, metavar="FILE", help="schedule.json")
    ap.add_argument("--island", required=True, help="this island's name in the schedule")
    ap.add_argument("--hosts", required=True, metavar="IP:PORT[,..]",
                    help="the island's hosts (the only sources replicated)")
    ap.add_argument("--edge", metavar="IP:PORT",
                    help="the island's edge aggregator: with K > 1 hosts its RESULTs "
                         "are copied to every host")
    ap.add_argument("--stats", metavar="FILE", help="counters as JSON at exit")
    args = ap.parse_args(argv)
    from .plan import replicator_table, result_table
    with open(args.schedule) as f:
        doc = json.load(f)
    results = result_table(doc, args.island)
    if results and not args.edge:
        ap.error("--edge: needed with more than one host per island")
    model = EdgeReplicator(replicator_table(doc, args.island),
                       [_addr(h) for h in args.hosts.split(",")], results,
                       _addr(args.edge) if args.edge else None)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind(_addr(args.listen))
    stopped = []
    signal.signal(signal.SIGTERM, lambda *_: stopped.append(1))
    from ina_fabric.host.lab.delayline import realtime_tune
    realtime_tune()               # SCHED_FIFO where allowed: network hardware, as the delay line
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    try:
        serve(sock, model, lambda: bool(stopped))
    except KeyboardInterrupt:
        pass
    if args.stats:
        with open(args.stats, "w") as f:
            json.dump(dict(model.counters), f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
