"""Socket buffers sized past ``net.core.rmem_max`` where we may, and the kernel's count of
datagrams a full receive buffer dropped.

Why a worker's receive buffer must be large (issue 18, the transformer on the lab): in a
bounded mode the switch does not wait for a late worker. While it still computes, the
others' slots close at their deadlines and every RESULT of the call comes to it (unicast
or multicast) and waits in its socket until it starts the call. A buffer of 4 MiB (this
machine's ``rmem_max``) holds about 0.3 s of 8 KB RESULTs at 100 Mbit/s; a worker later
than that loses the overflow, and by the time it asks the switch again the slots have
been reused: ``AllreduceTooLate`` for the whole job. ``WORKER_RCVBUF`` holds seconds of
RESULTs at that rate; the memory is used only while datagrams wait.

Why a worker's send buffer is small (issue 39, docs/congestion.md, "A worker's share of
its host's queue"): every datagram a worker has sent and its host has not yet put on the
wire (held in the interface's qdisc) counts against the socket's send buffer, so the
buffer bounds the worker's share of its own host's queue. A queue is first in, first
out: a flow's share of the link is its share of the queue. TCP keeps about two 64 KB
segments there, or 1 ms at its rate if that is more (TCP small queues, TSQ); a worker with
an 8 MB buffer kept its whole window there, filled the queue, had its own sends refused
and halved its window each time, and so lost to a UDP flood beside it on the same host,
while a buffer as large as TCP's share holds its place. ``local_queue_bytes`` is that
rule; a full buffer makes the loop wait for the queue to drain (``SwitchClient``'s
``local_waits``).

``SO_RCVBUFFORCE`` needs CAP_NET_ADMIN (root, as the lab runs); without it the plain
option is used, capped by the kernel at ``rmem_max``. The Python standard library has
no reader for the per-socket drop counter, so ``socket_drops`` reads ``/proc/net/udp``.
"""

import socket

__all__ = ["size_buffers", "socket_drops", "local_queue_bytes", "WORKER_RCVBUF",
           "LOCAL_QUEUE_MIN", "LOCAL_QUEUE_S", "LOCAL_QUEUE_MAX"]

# Python's socket module does not export these (Linux, asm-generic/socket.h); before this
# module the switch asked ``getattr(socket, "SO_RCVBUFFORCE", None)``, got None, and
# quietly ran with rmem_max
_FORCE = {"rcv": getattr(socket, "SO_RCVBUFFORCE", 33), "snd": getattr(socket, "SO_SNDBUFFORCE", 32)}

#: a worker's receive buffers: about 5 s of jumbo RESULTs at 100 Mbit/s
WORKER_RCVBUF = 64 << 20

#: a worker's send buffer (``local_queue_bytes``), as TCP small queues: at least two 64 KB
#: segments, or LOCAL_QUEUE_S of the worker's rate, at most tcp_limit_output_bytes' 4 MB.
#: The kernel doubles a send buffer for its own overhead (``SO_SNDBUF`` reads back twice
#: it), so about these bytes of datagrams fit, jumbo or not
LOCAL_QUEUE_MIN = 128 << 10
LOCAL_QUEUE_S = 2e-3
LOCAL_QUEUE_MAX = 4 << 20


def local_queue_bytes(rate: float | None) -> int:
    """The send buffer of a worker sending ``rate`` bytes/s (None: not known yet): what
    its datagrams may hold of its host's own queue (module docstring)."""
    if not rate or rate <= 0:
        return LOCAL_QUEUE_MIN
    return int(min(LOCAL_QUEUE_MAX, max(LOCAL_QUEUE_MIN, rate * LOCAL_QUEUE_S)))


def size_buffers(sock: socket.socket, rcv: int | None = None, snd: int | None = None) -> int:
    """Set the receive (and send) buffer of ``sock`` to at least these bytes, forced past
    the sysctl limits where the process may; returns the receive buffer the kernel
    granted (bytes, as ``SO_RCVBUF`` reads back: twice the usable payload)."""
    for size, force, plain in ((rcv, _FORCE["rcv"], socket.SO_RCVBUF),
                               (snd, _FORCE["snd"], socket.SO_SNDBUF)):
        if size is None:
            continue
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, size)
        except OSError:    # not permitted (no CAP_NET_ADMIN): the kernel caps the plain one
            sock.setsockopt(socket.SOL_SOCKET, plain, size)
    return sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)


def socket_drops(sock: socket.socket) -> int | None:
    """Datagrams the kernel dropped at ``sock`` (full receive buffer), from the ``drops``
    column of ``/proc/net/udp`` (this network namespace's sockets); None when unknown."""
    try:
        host, port = sock.getsockname()[:2]
        # the address as the kernel prints it: the 32-bit word in host (little-endian) order
        want = f"{int.from_bytes(socket.inet_aton(host), 'little'):08X}:{port:04X}"
        with open("/proc/net/udp") as f:
            next(f)
            for line in f:
                cols = line.split()
                if cols[1] == want:
                    return int(cols[-1])
    except (OSError, ValueError, StopIteration):
        return None
    return None
