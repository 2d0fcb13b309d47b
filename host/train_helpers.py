"""Small process helpers shared by training and benchmarks."""

__all__ = ["start_switch_process"]


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
