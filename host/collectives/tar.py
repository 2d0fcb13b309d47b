"""Transpose AllReduce (TAR): bounded in time over UDP (OptiReduce style), reliable over TCP.

Rank ``r`` of ``N`` owns shard ``r`` of the bucket (``ceil(n/N)`` entries; the last shards
may be shorter or empty, so any bucket size works). Two rounds instead of a ring's
``2(N-1)``:

1. scatter: every rank sends shard ``o`` of its bucket to owner ``o``; the owner sums;
2. broadcast: every owner sends its reduced shard to every other rank.

``TarUdp`` (bounded): each shard travels as UDP datagrams of ``elements`` float32 entries
with a 28-byte header (``TAR_HEADER``: call, sender, chunk, element offset, count, and the
sender's own deadline estimate for the phase) so a datagram is placed wherever and whenever
it arrives, and the receivers agree on the median of the estimates. Each phase ends when all its data is
in, or at its deadline, or early (see ``tar_phases``; per sender, the deadline runs from
its first datagram, so a rank that starts late is not cut off): the last ``tail_percent``
of each sender's datagrams carry a TAIL flag, and once a tail datagram and all but the last
percentile of a sender's datagrams are in, that sender gets only
``policy.early_timeout()`` more. Before a phase ends, the socket is drained: what already
arrived counts. A chunk that reached its owner from ``c < N`` ranks is
rescaled by ``N/c`` (the count travels in the broadcast header, so every rank knows exactly
which entries are partial). A broadcast chunk that never arrives is filled with ``N`` times
the local value (``fill="local"``, OptiReduce's choice) or zeros; its range is reported in
``stats["missing"]`` so ``host.collectives.consistency`` can repair it; or, with
``resolve="agree"`` / ``"repair"``, the ranks make their results identical right after the
broadcast deadline (see ``TarUdp._resolve``). Two loss figures:
``lost_fraction`` (entries of the result that are not the exact sum: any contribution
missing) and ``dropped_fraction`` (the share of the ``n * N`` contributions missing, a
missing broadcast entry counting ``N``), which tracks the datagram loss rate. Duplicates are
ignored, datagrams of an older call are counted late, datagrams of a newer call (a faster
rank already started it) are kept for it. ``hold`` bounds how long a straggler (a rank
that starts its call late) can hold a phase: ``hold`` deadlines after the phase start, its
data is counted missing.

Deadlines come from a ``DeadlinePolicy`` (one per phase): during its calibration rounds
the call runs as TAR over TCP and the measured phase times feed the policy.

``TarTcp`` (reliable): the same two rounds over a TCP mesh (the baseline, and the
calibration path). ``RingTcp``: Gloo's ring algorithm (reduce-scatter + allgather,
``2(N-1)`` steps) over the same mesh, so a ring and TAR see the same impaired transport.

Impairment: UDP datagrams go through the ``Impairment`` policy of
``host.transport.impair`` (loss, duplicates, reordering, lognormal delay per datagram),
decided a batch at a time by ``_ImpairedSender``. On TCP, a message of ``s`` segments (``elements`` entries
each) is held for the largest of ``s`` per-segment delays from the same distribution, plus
``tcp_loss_penalty`` for each lost (retransmitted) segment, and messages on a connection
stay in order (head-of-line blocking), which is how a reliable byte stream sees a tail.
"""

import heapq
import math
import queue
import socket
import struct
import threading
import time
from types import SimpleNamespace

import numpy as np

from .base import Collective, DirStore
from ..deadline import DeadlinePolicy
from .tar_phases import TarPhases, ACCEPT, BCAST

__all__ = ["Mesh", "TarUdp", "TarTcp", "RingTcp", "TAR_HEADER", "MAGIC", "Kind", "Flag",
           "DirStore"]

MAGIC = 0x7A52
# magic kind flags call sender count chunk offset nelem estimate (the sender's own deadline
# for this phase, microseconds: the receivers agree on the median of these)
TAR_HEADER = struct.Struct("<HBBIHHIIII")
HB = TAR_HEADER.size                       # 28 bytes
_HDR_DTYPE = np.dtype([("magic", "<u2"), ("kind", "u1"), ("flags", "u1"), ("call", "<u4"),
                       ("sender", "<u2"), ("count", "<u2"), ("chunk", "<u4"),
                       ("offset", "<u4"), ("nelem", "<u4"), ("estimate", "<u4")])
assert _HDR_DTYPE.itemsize == HB


class Kind:
    SCATTER = 1
    BCAST = 2


class Flag:
    TAIL = 1


_MSG = struct.Struct("<II")   # TCP framing: payload length, tag


def recv_exact(sock, n, buf=None, who="TAR mesh"):
    """Exactly ``n`` bytes from a TCP socket (into ``buf`` if given); ConnectionError
    naming ``who`` when the peer closes first."""
    buf = bytearray(n) if buf is None else buf
    mv = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(mv[got:], n - got)
        if k == 0:
            raise ConnectionError(f"{who}: peer closed the connection")
        got += k
    return buf


class _TcpPeer:
    """One TCP connection, with a sender thread (sends never block the caller; optional
    per-message delay for impairment, in order)."""

    def __init__(self, sock, impairment=None, seg_bytes=4096, loss_penalty=0.0):
        self.sock = sock
        self.imp = impairment if impairment is not None and impairment.active else None
        self.seg_bytes = seg_bytes
        self.loss_penalty = loss_penalty
        self.q = queue.Queue()
        self.error = None
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def send(self, tag: int, payload):
        data = payload if isinstance(payload, (bytes, bytearray)) else memoryview(payload).cast("B")
        release = 0.0
        if self.imp is not None:
            nseg = max(1, -(-len(data) // self.seg_bytes))
            copies, hold = self.imp.decide(nseg)
            d = hold[0] + np.where(copies == 0, self.loss_penalty, 0.0)
            release = time.monotonic() + float(d.max())
        self.q.put((release, _MSG.pack(len(data), tag), bytes(data)))

    def _run(self):
        last = 0.0
        while True:
            item = self.q.get()
            if item is None:
                return
            release, head, data = item
            release = max(release, last)
            wait = release - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            last = release
            try:
                self.sock.sendall(head)
                self.sock.sendall(data)
            except OSError as e:
                self.error = e
                return

    def recv(self, tag: int) -> bytearray:
        head = recv_exact(self.sock, _MSG.size)
        n, t = _MSG.unpack(head)
        if t != tag:
            raise ConnectionError(f"TAR mesh: expected message tag {tag}, got {t}")
        return recv_exact(self.sock, n)

    def close(self):
        self.q.put(None)
        self.t.join(timeout=2)
        try:
            self.sock.close()
        except OSError:
            pass


class _ImpairedSender:
    """Sends batches of datagrams through an ``Impairment``, deciding a whole batch at
    once (one vectorized draw, instead of per datagram as ``ImpairedSocket.sendto``
    does) and releasing held copies from one timer thread in release-time order."""

    def __init__(self, sock, impairment):
        self.sock, self.imp = sock, impairment
        self.heap = []
        self.cv = threading.Condition()
        self.closed = False
        self.seq = 0
        self.t = threading.Thread(target=self._pump, daemon=True)
        self.t.start()

    def send_batch(self, items):
        """items: [(bytes-like, addr)] in send order."""
        if not items:
            return
        copies, hold = self.imp.decide(len(items))
        now = time.monotonic()
        held = []
        for i, (data, addr) in enumerate(items):
            for k in range(int(copies[i])):
                h = float(hold[k, i])
                if h <= 0:
                    try:
                        self.sock.sendto(data, addr)
                    except OSError:
                        pass
                else:
                    self.seq += 1
                    held.append((now + h, self.seq, bytes(data), addr))
        if held:
            with self.cv:
                for item in held:
                    heapq.heappush(self.heap, item)
                self.cv.notify()

    def _pump(self):
        while True:
            with self.cv:
                while not self.closed and (not self.heap
                                           or self.heap[0][0] > time.monotonic()):
                    self.cv.wait(self.heap[0][0] - time.monotonic() if self.heap else None)
                if self.closed:
                    return
                due = []
                now = time.monotonic()
                while self.heap and self.heap[0][0] <= now:
                    due.append(heapq.heappop(self.heap))
            for _, _, data, addr in due:
                try:
                    self.sock.sendto(data, addr)
                except OSError:
                    pass

    def close(self):
        with self.cv:
            self.closed = True
            self.cv.notify()
        self.t.join(timeout=1)


class Mesh:
    """The transports of one rank: a UDP socket and a TCP connection to every peer.

    ``Mesh(rank, world, store)`` binds both on ``host`` (ephemeral ports), publishes them
    through ``store`` (``set``/``get``: a ``torch.distributed.Store`` or a ``DirStore``)
    and connects the TCP mesh (rank j connects to every i < j)."""

    def __init__(self, rank, world, store, host="127.0.0.1", prefix="tar", impairment=None,
                 tcp_impairment=None, seg_bytes=4096, tcp_loss_penalty=None, timeout=30.0):
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} of world {world}")
        self.rank, self.world = rank, world
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        u.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        u.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
        u.bind((host, 0))
        self.udp_raw = u
        self.udp = u
        self.sender = None
        if impairment is not None and impairment.active:
            self.sender = _ImpairedSender(u, impairment)
        self.impairment = impairment
        lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lst.bind((host, 0))
        lst.listen(world)
        me = f"{host}:{u.getsockname()[1]}:{lst.getsockname()[1]}"
        store.set(f"{prefix}/addr/{rank}", me)
        self.udp_addrs, tcp_addrs = [], []
        for i in range(world):
            h, up, tp = store.get(f"{prefix}/addr/{i}").decode().split(":")
            self.udp_addrs.append((h, int(up)))
            tcp_addrs.append((h, int(tp)))
        if tcp_loss_penalty is None:
            med = tcp_impairment.delay_median if tcp_impairment is not None else 0.0
            tcp_loss_penalty = 3 * med + 0.0002
        socks = [None] * world
        lst.settimeout(timeout)
        for i in range(rank):
            s = socket.create_connection(tcp_addrs[i], timeout=timeout)
            s.sendall(struct.pack("<I", rank))
            socks[i] = s
        for _ in range(rank + 1, world):
            s, _ = lst.accept()
            j = struct.unpack("<I", recv_exact(s, 4))[0]
            socks[j] = s
        lst.close()
        self.peers = [None] * world
        for i, s in enumerate(socks):
            if s is None:
                continue
            s.settimeout(None)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            imp = None
            if tcp_impairment is not None and tcp_impairment.active:
                from ..transport.impair import Impairment
                imp = Impairment(loss=tcp_impairment.loss,
                                 delay_median=tcp_impairment.delay_median,
                                 p99_over_p50=tcp_impairment.p99_over_p50,
                                 seed=tcp_impairment.seed * 1000 + rank * world + i)
            self.peers[i] = _TcpPeer(s, imp, seg_bytes, tcp_loss_penalty)
        self._tag = 0

    def next_tag(self):
        self._tag = (self._tag + 1) & 0xFFFFFFFF
        return self._tag

    def barrier(self):
        tag = self.next_tag()
        for i, p in enumerate(self.peers):
            if p is not None:
                p.send(tag, b"")
        for i, p in enumerate(self.peers):
            if p is not None:
                p.recv(tag)

    def send_batch(self, items):
        """Send datagrams [(data, addr)] in order (through the impairment, if any)."""
        if self.sender is not None:
            self.sender.send_batch(items)
            return
        sock = self.udp
        for data, addr in items:
            try:
                sock.sendto(data, addr)
            except OSError:
                pass   # ENOBUFS etc.: the datagram is lost, and counted as such

    def close(self):
        for p in self.peers:
            if p is not None:
                p.close()
        if self.sender is not None:
            self.sender.close()
        self.udp.close()


def shard_bounds(n, world):
    S = -(-n // world) if n else 0
    lo = np.minimum(np.arange(world) * S, n)
    hi = np.minimum(lo + S, n)
    return lo, hi


# ------------------------------------------------------------------------------------
class TarTcp(Collective):
    """Reliable TAR over the TCP mesh: exact, deterministic (each owner sums in rank
    order), the baseline and the calibration path of ``TarUdp``."""
    name = "tar-tcp"

    def __init__(self, mesh: Mesh, own_mesh=False):
        self.mesh, self.rank, self.world = mesh, mesh.rank, mesh.world
        self.own_mesh = own_mesh
        self.calls = 0

    def allreduce(self, x, phase_times=None):
        t0 = time.perf_counter()
        x0 = np.asarray(x, np.float32)
        v = np.ascontiguousarray(x0).reshape(-1)
        n, N, r = v.size, self.world, self.rank
        lo, hi = shard_bounds(n, N)
        peers = self.mesh.peers
        tag = self.mesh.next_tag()
        for o in range(N):
            if o != r:
                peers[o].send(tag, v[lo[o]:hi[o]])
        parts = [None] * N
        for s in range(N):
            parts[s] = v[lo[r]:hi[r]] if s == r else np.frombuffer(peers[s].recv(tag), np.float32)
        acc = parts[0].copy()
        for s in range(1, N):
            acc += parts[s]
        t1 = time.perf_counter()
        tag = self.mesh.next_tag()
        for o in range(N):
            if o != r:
                peers[o].send(tag, acc)
        out = np.empty(n, np.float32)
        out[lo[r]:hi[r]] = acc
        for o in range(N):
            if o != r:
                out[lo[o]:hi[o]] = np.frombuffer(peers[o].recv(tag), np.float32)
        t2 = time.perf_counter()
        self.calls += 1
        if phase_times is not None:
            phase_times[:] = [t1 - t0, t2 - t1]
        return out.reshape(x0.shape), {"seconds": t2 - t0, "entries": n, "entries_lost": 0,
                                       "lost_fraction": 0.0, "dropped_fraction": 0.0,
                                       "scatter_time": t1 - t0,
                                       "bcast_time": t2 - t1, "missing": []}

    def close(self):
        if self.own_mesh:
            self.mesh.close()


class RingTcp(Collective):
    """Gloo's ring allreduce (reduce-scatter then allgather, 2(N-1) steps) over the same
    TCP mesh and the same impairment as ``TarTcp``: the reliable ring under a tail."""
    name = "ring-tcp"

    def __init__(self, mesh: Mesh, own_mesh=False):
        self.mesh, self.rank, self.world = mesh, mesh.rank, mesh.world
        self.own_mesh = own_mesh

    def allreduce(self, x):
        t0 = time.perf_counter()
        x0 = np.asarray(x, np.float32)
        out = np.array(x0, np.float32, copy=True).reshape(-1)
        n, N, r = out.size, self.world, self.rank
        lo, hi = shard_bounds(n, N)
        if N > 1:
            right, left = self.mesh.peers[(r + 1) % N], self.mesh.peers[(r - 1) % N]
            for step in range(N - 1):          # reduce-scatter
                s, d = (r - step) % N, (r - step - 1) % N
                tag = self.mesh.next_tag()
                right.send(tag, out[lo[s]:hi[s]].copy())
                out[lo[d]:hi[d]] += np.frombuffer(left.recv(tag), np.float32)
            for step in range(N - 1):          # allgather
                s, d = (r + 1 - step) % N, (r - step) % N
                tag = self.mesh.next_tag()
                right.send(tag, out[lo[s]:hi[s]].copy())
                out[lo[d]:hi[d]] = np.frombuffer(left.recv(tag), np.float32)
        dt = time.perf_counter() - t0
        return out.reshape(x0.shape), {"seconds": dt, "entries": n, "entries_lost": 0,
                                       "lost_fraction": 0.0, "dropped_fraction": 0.0,
                                       "missing": []}

    def close(self):
        if self.own_mesh:
            self.mesh.close()


# ------------------------------------------------------------------------------------
class TarUdp(Collective):
    """Bounded-time TAR over UDP (see the module docstring).

    ``scatter_policy`` / ``bcast_policy``: ``DeadlinePolicy`` objects (default: adaptive,
    5 calibration rounds over TCP). ``fill``: ``"local"`` or ``"zero"`` for broadcast
    chunks that never arrived."""
    name = "tar-udp"

    def __init__(self, mesh: Mesh, elements=1024, scatter_policy=None, bcast_policy=None,
                 tail_percent=2.0, fill="local", own_mesh=False, max_stash=200000,
                 resolve="local", hold=3.0):
        if fill not in ("local", "zero"):
            raise ValueError(f"fill {fill!r}: expected 'local' or 'zero'")
        if resolve not in ("local", "agree", "repair"):
            raise ValueError(f"resolve {resolve!r}: expected local, agree or repair")
        self.resolve = resolve
        if not 1 <= elements <= 16000:
            raise ValueError(f"elements {elements}: need 1..16000 per datagram")
        self.mesh, self.rank, self.world = mesh, mesh.rank, mesh.world
        self.own_mesh = own_mesh
        self.E = int(elements)
        self.sp = scatter_policy or DeadlinePolicy()
        self.bp = bcast_policy or DeadlinePolicy()
        self.tail_percent = tail_percent
        if hold is not None and hold < 1:
            raise ValueError(f"hold {hold}: the straggler bound is >= 1 deadline (or None)")
        self.hold = hold
        self.fill = fill
        self.tcp = TarTcp(mesh)
        self.call = 0
        self.stash = {}
        self.max_stash = max_stash
        self.totals = {"late": 0, "dropped_bad": 0, "stashed": 0}
        self._rx = bytearray(HB + 4 * self.E + 64)

    # -- public --------------------------------------------------------------------------
    def allreduce(self, x):
        x0 = np.asarray(x, np.float32)
        v = np.ascontiguousarray(x0).reshape(-1)
        call = self.call
        self.call += 1
        if self.sp.calibrating or self.bp.calibrating:
            pt = [0.0, 0.0]
            out, st = self.tcp.allreduce(v, phase_times=pt)
            if self.sp.calibrating:
                self.sp.observe(pt[0])
            if self.bp.calibrating:
                self.bp.observe(pt[1])
            st.update(calibrating=True, call=call, mode="tcp")
            return out.reshape(x0.shape), st
        out, st = self._bounded(v, call, self.sp.deadline(), self.bp.deadline())
        # A phase that timed out saw either late data (a deadline too short: the policy
        # gets the censored duration and may grow) or lost data (dropped in a queue:
        # waiting longer would not have brought it). Datagrams of older calls arriving
        # now are the evidence of lateness; without them the policy gets the time the
        # data that came took, and no growth: with real drops (tbf queues under
        # background flows) the deadline otherwise inflated 16-fold, to seconds.
        late = st["late"] > 0
        for pol, ph in ((self.sp, "scatter"), (self.bp, "bcast")):
            timed_out = st[f"{ph}_timed_out"]
            d = st[f"{ph}_time"] if (late or not timed_out) else st[f"{ph}_arrived_time"]
            pol.observe(d, st[f"{ph}_lost_fraction"], timed_out and late)
        return out.reshape(x0.shape), st

    def close(self):
        if self.own_mesh:
            self.mesh.close()

    # -- the bounded mechanism -----------------------------------------------------------
    def _packets(self, data, kind, call, counts, base_offset, estimate=0.0):
        """All datagrams of one shard as one uint8 matrix (one row per chunk) + lengths."""
        E, nel_total = self.E, data.size
        nch = -(-nel_total // E)
        rows = np.zeros((nch, HB + 4 * E), np.uint8)
        pad = np.zeros(nch * E, np.float32)
        pad[:nel_total] = data
        rows[:, HB:] = pad.view(np.uint8).reshape(nch, 4 * E)
        nel = np.full(nch, E, np.int64)
        if nch:
            nel[-1] = nel_total - (nch - 1) * E
        tail = max(1, math.ceil(nch * self.tail_percent / 100.0))
        hdr = np.zeros(nch, _HDR_DTYPE)
        hdr["estimate"] = min(int(estimate * 1e6), 0xFFFFFFFF)
        hdr["magic"], hdr["kind"], hdr["call"], hdr["sender"] = MAGIC, kind, call, self.rank
        hdr["count"] = counts
        hdr["chunk"] = np.arange(nch)
        hdr["offset"] = base_offset + np.arange(nch) * E
        hdr["nelem"] = nel
        hdr["flags"][nch - tail:] = Flag.TAIL
        rows[:, :HB] = hdr.view(np.uint8).reshape(nch, HB)
        return rows, HB + 4 * nel

    def _send_interleaved(self, per_dest):
        """per_dest: [(addr, rows, lengths)]; send round-robin so every peer progresses."""
        items = []
        longest = max((len(r) for _, r, _ in per_dest), default=0)
        for k in range(longest):
            for addr, rows, lens in per_dest:
                if k < len(rows):
                    items.append((rows[k, :lens[k]], addr))
        self.mesh.send_batch(items)
        self._bytes += sum(int(lens.sum()) for _, _, lens in per_dest)
        return len(items)

    def _resolve(self, bgot, bcount, out, nch, lo, hi):
        """After the broadcast deadline, make every rank's result the same, over the TCP
        mesh (small messages, sent only once the bounded phases are over):

        * ``agree``: exchange the lists of missed broadcast chunks; every rank zeroes the
          union (one tiny all-to-all; the result is identical everywhere, a little more
          is lost);
        * ``repair``: ask each owner for only the chunks of its shard this rank missed, and
          serve the others' requests (traffic proportional to the loss; exact).
        Returns the number of chunks repaired (or zeroed in agreement)."""
        mesh, N, r, E = self.mesh, self.world, self.rank, self.E
        peers = [o for o in range(N) if o != r]
        tag = mesh.next_tag()
        if self.resolve == "agree":
            mine = np.concatenate([np.flatnonzero(~bgot[o]).astype(np.int64) + (o << 32)
                                   for o in range(N)])
            for o in peers:
                mesh.peers[o].send(tag, mine)
            union = [mine] + [np.frombuffer(mesh.peers[s].recv(tag), np.int64) for s in peers]
            u = np.unique(np.concatenate(union))
            for code in u:
                bgot[int(code) >> 32][int(code) & 0xFFFFFFFF] = False
            return int(u.size)
        for o in peers:
            mesh.peers[o].send(tag, np.flatnonzero(~bgot[o]).astype(np.int64))
        reqs = {s: np.frombuffer(mesh.peers[s].recv(tag), np.int64) for s in peers}
        tag = mesh.next_tag()
        own_lo, own_len = int(lo[r]), int(hi[r] - lo[r])
        for s, ks in reqs.items():
            if ks.size and (ks.max() >= nch[r]):
                raise ConnectionError(f"TAR repair: rank {s} asked for chunk {ks.max()}")
            parts = [bcount[r][ks].astype(np.int32).view(np.float32)]
            parts += [out[own_lo + k * E: own_lo + min((k + 1) * E, own_len)] for k in ks]
            mesh.peers[s].send(tag, np.concatenate(parts) if ks.size else b"")
        got = 0
        for o in peers:
            data = np.frombuffer(mesh.peers[o].recv(tag), np.float32)
            ks = np.flatnonzero(~bgot[o])
            if not ks.size:
                continue
            counts = data[:ks.size].view(np.int32)
            pos = ks.size
            olen = int(hi[o] - lo[o])
            for k, c in zip(ks, counts):
                a, b = int(lo[o] + k * E), int(lo[o] + min((k + 1) * E, olen))
                out[a:b] = data[pos:pos + b - a]
                pos += b - a
                bgot[o][k] = True
                bcount[o][k] = int(c)
            got += int(ks.size)
        return got

    def _bounded(self, v, call, s_deadline, b_deadline):
        t0 = time.perf_counter()
        E, N, r = self.E, self.world, self.rank
        n = v.size
        self._bytes = 0
        lo, hi = shard_bounds(n, N)
        nch = -(-(hi - lo) // E)
        peers = [o for o in range(N) if o != r]
        addrs = self.mesh.udp_addrs
        # the phase decisions (pure, tar_phases.TarPhases); the data here
        ph = TarPhases(r, nch, s_deadline, b_deadline, self.sp.early_timeout(),
                       self.bp.early_timeout(), self.tail_percent, self.hold)
        got, bgot = ph.got, ph.bgot
        acc = v[lo[r]:hi[r]].copy()
        bcount = [np.full(nch[o], N, np.int64) for o in range(N)]
        out = np.empty(n, np.float32)
        st = {"late": 0, "dup": 0, "bad": 0, "stashed": 0}
        s_expected, b_expected = ph.expected()
        clock = time.monotonic
        cx = SimpleNamespace(call=call, n=n, lo=lo, hi=hi, nch=nch, ph=ph, acc=acc,
                             bcount=bcount, out=out, st=st, peers=peers,
                             s_expected=s_expected, b_expected=b_expected)

        def handle(buf, nbytes):
            self._handle_datagram(cx, buf, nbytes)

        # scatter: send, then take what was stashed for this call, then receive
        per_dest = []
        for o in peers:
            if nch[o]:
                rows, lens = self._packets(v[lo[o]:hi[o]], Kind.SCATTER, call, N, lo[o],
                                           s_deadline)
                per_dest.append((addrs[o], rows, lens))
        ph.start(clock())
        sent = self._send_interleaved(per_dest)
        for old in [c for c in self.stash if (c - call) & 0x80000000 or c == call]:
            pk = self.stash.pop(old)
            if old == call:
                for b in pk:
                    handle(b, len(b))
            else:
                st["late"] += len(pk)
        sock = self.mesh.udp_raw
        rx = self._rx
        s_time = b_time = 0.0

        def drain():
            """What already arrived counts as in: take it all before a phase ends."""
            sock.settimeout(0.0)
            k = 0
            while True:
                try:
                    nb = sock.recv_into(rx)
                except (BlockingIOError, socket.timeout, ConnectionRefusedError):
                    return k
                handle(rx, nb)
                k += 1

        while True:
            now = clock()
            end = ph.end()
            if end is not None and now >= end and drain():
                continue
            if end is None or now >= end:
                if ph.phase == BCAST:
                    b_time = ph.end_bcast(now)
                    break
                s_time = ph.end_scatter(now)
                # finish the own shard: rescale partial chunks by N / count
                cnt = ph.counts()
                if nch[r] and (cnt < N).any():
                    acc *= np.repeat((N / cnt).astype(np.float32), E)[:acc.size]
                bcount[r] = cnt.astype(np.int64)
                out[lo[r]:hi[r]] = acc
                if nch[r] and peers:
                    rows, lens = self._packets(acc, Kind.BCAST, call, cnt, lo[r],
                                               b_deadline)
                    ph.start_bcast(clock())
                    sent += self._send_interleaved([(addrs[o], rows, lens) for o in peers])
                else:
                    ph.start_bcast(clock())
                continue
            sock.settimeout(max(end - now, 1e-5))
            try:
                nbytes = sock.recv_into(rx)
            except (socket.timeout, BlockingIOError, ConnectionRefusedError):
                continue
            handle(rx, nbytes)
        return self._bounded_result(cx, v, t0, sent, s_time, b_time, s_deadline, b_deadline)

    def _handle_datagram(self, cx, buf, nbytes):
        """One datagram of call ``cx.call`` (a bounded TAR call's state): counted, stashed
        for a later call, or taken into the own shard (SCATTER) or the result (BCAST)."""
        E, N, r, n, call = self.E, self.world, self.rank, cx.n, cx.call
        lo, nch, ph, acc, out, bcount, st = cx.lo, cx.nch, cx.ph, cx.acc, cx.out, cx.bcount, cx.st
        clock = time.monotonic
        if nbytes < HB:
            st["bad"] += 1
            return
        magic, kind, flags, pcall, sender, count, chunk, offset, nelem, est = \
            TAR_HEADER.unpack_from(buf)
        if (magic != MAGIC or nbytes != HB + 4 * nelem or sender >= N or sender == r
                or offset + nelem > n or nelem > E):
            st["bad"] += 1
            return
        if pcall != call:
            if (pcall - call) & 0x80000000:       # older call
                st["late"] += 1
            elif len(self.stash.setdefault(pcall, [])) < self.max_stash:
                self.stash[pcall].append(bytes(buf[:nbytes]))
                st["stashed"] += 1
            return
        data = np.frombuffer(buf, np.float32, count=nelem, offset=HB)
        if kind == Kind.SCATTER:
            if chunk >= nch[r] or offset != lo[r] + chunk * E:
                st["bad"] += 1
                return
            verdict = ph.on_scatter(sender, chunk, flags & Flag.TAIL, clock(),
                                    est * 1e-6 if est else None)
            if verdict == ACCEPT:
                a = chunk * E
                acc[a:a + nelem] += data
            else:
                st[verdict] += 1        # "late" or "dup"
        elif kind == Kind.BCAST:
            if chunk >= nch[sender] or offset != lo[sender] + chunk * E:
                st["bad"] += 1
                return
            if ph.on_bcast(sender, chunk, flags & Flag.TAIL, clock(),
                           est * 1e-6 if est else None) == ACCEPT:
                out[offset:offset + nelem] = data
                bcount[sender][chunk] = count
            else:
                st["dup"] += 1
        else:
            st["bad"] += 1

    def _bounded_result(self, cx, v, t0, sent, s_time, b_time, s_deadline, b_deadline):
        """After both phases of a bounded call: resolve or fill the missing broadcast
        chunks, and count what was lost (the call's statistics)."""
        E, N, r, n, call = self.E, self.world, self.rank, cx.n, cx.call
        lo, hi, nch, ph, out, bcount, st = cx.lo, cx.hi, cx.nch, cx.ph, cx.out, cx.bcount, cx.st
        got, bgot, peers = ph.got, ph.bgot, cx.peers
        s_expected, b_expected = cx.s_expected, cx.b_expected
        recv_s, recv_b = ph.received()
        s_timed_out, b_timed_out = recv_s < s_expected, recv_b < b_expected
        s_early, b_early = ph.scatter.early, ph.bcast.early
        repaired = 0
        if self.resolve != "local" and peers:
            repaired = self._resolve(bgot, bcount, out, nch, lo, hi)
        # missing broadcast chunks: fill, and report their ranges
        missing = []
        missing_entries = 0
        partial_entries = 0
        dropped_contrib = 0     # contributions missing from the result, over n * N
        fill_local = self.fill == "local" and self.resolve == "local"
        for o in range(N):
            if not nch[o]:
                continue
            lens = np.minimum(E, (hi[o] - lo[o]) - np.arange(nch[o]) * E)
            miss = np.flatnonzero(~bgot[o])
            for k in miss:
                a = int(lo[o] + k * E)
                b = a + int(lens[k])
                out[a:b] = N * v[a:b] if fill_local else 0.0
                missing.append((a, b - a))
            missing_entries += int(lens[miss].sum())
            part = bgot[o] & (bcount[o] < N)
            partial_entries += int(lens[part].sum())
            dropped_contrib += int(((N - bcount[o][part]) * lens[part]).sum())
        if self.resolve == "agree":
            missing = []        # every rank zeroed the same chunks: nothing to repair
        s_lost_pk = s_expected - recv_s
        b_lost_pk = b_expected - recv_b
        own = int(hi[r] - lo[r])
        s_contrib = (N - 1) * own
        s_lost_entries = int(((N - got.sum(0)) * np.minimum(E, own - np.arange(nch[r]) * E)).sum()) \
            if nch[r] else 0
        b_total = n - own
        self.totals["late"] += st["late"]
        self.totals["dropped_bad"] += st["bad"]
        self.totals["stashed"] += st["stashed"]
        entries_lost = missing_entries + partial_entries
        stats = {
            "seconds": time.perf_counter() - t0, "entries": n, "call": call, "mode": "udp",
            "calibrating": False,
            "entries_lost": entries_lost, "lost_fraction": entries_lost / n if n else 0.0,
            "entries_partial": partial_entries, "entries_missing": missing_entries,
            "dropped_fraction": (dropped_contrib + N * missing_entries) / (n * N) if n else 0.0,
            "missing": missing,
            "packets_sent": sent, "packets_expected": s_expected + b_expected,
            "bytes_sent": self._bytes,
            "packets_lost": s_lost_pk + b_lost_pk,
            "scatter_packets_lost": s_lost_pk, "bcast_packets_lost": b_lost_pk,
            "scatter_entries_lost": s_lost_entries,
            "scatter_lost_fraction": s_lost_entries / s_contrib if s_contrib else 0.0,
            "bcast_lost_fraction": missing_entries / b_total if b_total else 0.0,
            "scatter_time": s_time, "bcast_time": b_time,
            "scatter_arrived_time": ph.scatter.arrived(),
            "bcast_arrived_time": ph.bcast.arrived(),
            "scatter_deadline": ph.scatter.deadline, "bcast_deadline": ph.bcast.deadline,
            "scatter_own_deadline": s_deadline, "bcast_own_deadline": b_deadline,
            "scatter_held": ph.scatter.held, "bcast_held": ph.bcast.held,
            "scatter_timed_out": s_timed_out, "bcast_timed_out": b_timed_out,
            "scatter_early": s_early, "bcast_early": b_early,
            "late": st["late"], "duplicates": st["dup"], "bad": st["bad"],
            "repaired_chunks": repaired,
        }
        return out, stats
