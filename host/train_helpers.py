"""Small process helpers shared by training and benchmarks."""

import socket

__all__ = ["start_switch_process", "free_tcp_port"]


def free_tcp_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a rendezvous)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _serve(conn):
    from .switch import SwitchServer
    server = SwitchServer([], "127.0.0.1", 0)
    conn.send(server.address)
    server.serve_forever()


def start_switch_process(ctx):
    """A software switch with an empty job table (jobs arrive by CONTROL) in a child
    process of the multiprocessing context ``ctx``. Returns (address, process)."""
    a, b = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(b,), daemon=True)
    proc.start()
    return tuple(a.recv()), proc
