"""Namespaces, links, addresses and qdiscs through netlink (pyroute2), and processes
inside namespaces.

Nothing here touches the default namespace: every link is created inside a lab
namespace (a veth's peer goes straight into the other namespace), so the host's own
interfaces and routes never see a lab, and removing a lab's namespaces removes its links.
A lab namespace is named ``inalab-<lab id>-<node>``; that prefix is what ``down`` finds
after a crash.
"""

import ctypes
import ctypes.util
import os
import re
import signal
import subprocess
import time

__all__ = ["PREFIX", "ns_name", "lab_namespaces", "all_lab_ids", "ipr", "enter",
           "popen", "pids_in", "kill_in", "remove_namespace", "create_namespace",
           "add_veth", "shape", "qdisc_stats", "link_up", "available", "sysctl"]

PREFIX = "inalab"
_ID = re.compile(r"[a-z0-9]{1,8}")
NETNS_DIR = "/run/netns"
CLONE_NEWNET = 0x40000000


def check_id(lab_id: str) -> str:
    if not _ID.fullmatch(lab_id):
        raise ValueError(f"bad lab id {lab_id!r}: 1..8 lowercase letters and digits")
    return lab_id


def ns_name(lab_id: str, node: str) -> str:
    return f"{PREFIX}-{lab_id}-{node}"


def _listnetns() -> list[str]:
    try:
        return sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []


def lab_namespaces(lab_id: str) -> list[str]:
    """Names of the namespaces that lab ``lab_id`` has now (found by prefix)."""
    head = f"{PREFIX}-{lab_id}-"
    return [n for n in _listnetns() if n.startswith(head)]


def all_lab_ids() -> list[str]:
    ids = set()
    for n in _listnetns():
        parts = n.split("-")
        if len(parts) == 3 and parts[0] == PREFIX:
            ids.add(parts[1])
    return sorted(ids)


def available() -> str | None:
    """None if labs can be built here, else the reason (for skips and errors)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth, tbf)"
    try:
        import pyroute2  # noqa: F401
    except ImportError:
        return "needs pyroute2 (pip install 'ina-fabric[lab]')"
    if not os.path.exists("/proc/self/ns/net"):
        return "this kernel has no network namespaces"
    if not os.path.exists("/dev/net/tun"):
        return "no /dev/net/tun (TUN/TAP) for the delay line"
    return None


def create_namespace(name: str):
    from pyroute2 import netns
    if name in _listnetns():
        raise FileExistsError(f"namespace {name} exists already")
    netns.create(name)


def ipr(name: str):
    """An IPRoute bound to an existing namespace (never creates one)."""
    from pyroute2 import IPRoute
    return IPRoute(netns=name, flags=0)


_libc = None


def _get_libc():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    return _libc


def enter(name: str):
    """Move the calling process (one thread: use after fork) into namespace ``name``."""
    _get_libc()
    fd = os.open(os.path.join(NETNS_DIR, name), os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"setns {name}: {os.strerror(e)}")
    finally:
        os.close(fd)


def popen(name: str, argv, **kw) -> subprocess.Popen:
    """``subprocess.Popen(argv)`` with the child in namespace ``name`` and in a session
    of its own (so it is killed as a group)."""
    kw.setdefault("start_new_session", True)
    _get_libc()                  # loaded before the fork, never in the child
    return subprocess.Popen(argv, preexec_fn=lambda: enter(name), **kw)


def _ns_inode(name: str):
    st = os.stat(os.path.join(NETNS_DIR, name))
    return st.st_dev, st.st_ino


def pids_in(names) -> dict[int, str]:
    """Every process whose network namespace is one of ``names``: pid -> namespace."""
    want = {}
    for n in names:
        try:
            want[_ns_inode(n)] = n
        except FileNotFoundError:
            pass
    found = {}
    if not want:
        return found
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{pid}/ns/net")
        except OSError:
            continue
        n = want.get((st.st_dev, st.st_ino))
        if n is not None:
            found[int(pid)] = n
    return found


def kill_in(names, grace=2.0) -> int:
    """SIGTERM every process in the namespaces, SIGKILL what is left after ``grace``
    seconds; repeats until none is left. Returns how many there were."""
    seen = set()
    deadline = time.monotonic() + grace
    sig = signal.SIGTERM
    for _ in range(100):
        pids = pids_in(names)
        pids.pop(os.getpid(), None)
        if not pids:
            break
        seen.update(pids)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
        if time.monotonic() > deadline:
            sig = signal.SIGKILL
    for pid in seen:       # reap our own children so none stays a zombie
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
    return len(seen)


def sysctl(name: str, key: str, value: str):
    """Write ``/proc/sys/<key>`` inside namespace ``name`` (a forked child enters it; the
    net.* sysctls are per namespace)."""
    _get_libc()                  # loaded before the fork, never in the child
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            enter(name)
            with open(f"/proc/sys/{key}", "w") as f:
                f.write(value)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if status:
        raise OSError(f"sysctl {key}={value} in {name} failed")


def remove_namespace(name: str):
    from pyroute2 import netns
    try:
        netns.remove(name)
    except FileNotFoundError:
        pass


def link_up(ip, ifname, mtu=None, address=None, prefixlen=None, master=None):
    idx = ip.link_lookup(ifname=ifname)[0]
    if mtu:
        ip.link("set", index=idx, mtu=mtu)
    if master is not None:
        ip.link("set", index=idx, master=ip.link_lookup(ifname=master)[0])
    if address is not None:
        ip.addr("add", index=idx, address=str(address), prefixlen=prefixlen)
    ip.link("set", index=idx, state="up")
    return idx


def add_veth(ip, ifname, peer_ns, peer_ifname):
    """A veth pair: ``ifname`` in ``ip``'s namespace, ``peer_ifname`` in ``peer_ns``."""
    ip.link("add", ifname=ifname, kind="veth",
            peer={"ifname": peer_ifname, "net_ns_fd": peer_ns})


def shape(ip, ifname, rate_bits: int, queue_bytes: int, mtu: int):
    """tbf on ``ifname``'s egress: ``rate_bits`` bit/s, a bucket of at least 1 ms of
    the rate (and 4 MTUs), and a queue of ``queue_bytes`` beyond it."""
    idx = ip.link_lookup(ifname=ifname)[0]
    burst = max(rate_bits // 8 // 1000, 4 * (mtu + 14), 16384)
    ip.tc("add", "tbf", idx, handle="1:", rate=f"{rate_bits}bit", burst=burst,
          limit=burst + max(queue_bytes, 2 * (mtu + 14)))


def qdisc_stats(ip, ifname) -> dict:
    """The root qdisc's counters on ``ifname``: bytes, packets, drops, overlimits, backlog."""
    idx = ip.link_lookup(ifname=ifname)[0]
    for q in ip.get_qdiscs(idx):
        if q.get("parent") != 0xFFFFFFFF:
            continue
        st = q.get_attr("TCA_STATS") or {}
        st2 = dict((q.get_attr("TCA_STATS2") or {}).get("attrs", []))
        queue = st2.get("TCA_STATS_QUEUE", {})
        return {"kind": q.get_attr("TCA_KIND"), "bytes": st.get("bytes", 0),
                "packets": st.get("packets", 0), "drops": queue.get("drops", st.get("drop", 0)),
                "overlimits": queue.get("overlimits", st.get("overlimits", 0)),
                "backlog": queue.get("backlog", st.get("backlog", 0))}
    return {}
