"""A job on a fabric lab's switches: flat (the spine's switch alone, every host a member)
or a tree (each rack's switch sums its hosts, the spine's sums the racks: the tree
mechanism of ``host.switch.tree``, docs/fabric.md).

:func:`lab_tree` turns the workers' addresses (ranks numbered rack by rack) into the
lab's ``Tree``; :func:`install_in_lab` installs a job, flat or as a tree, from inside the
lab (its switches listen on lab addresses, which the default namespace cannot reach) and
returns what each worker passes its client (:func:`roles`).
"""

import json
import sys

__all__ = ["rack_of", "lab_tree", "roles", "install_in_lab",
           "remove_in_lab"]


def rack_of(topo, address: str) -> str:
    """The top-of-rack switch whose subnet holds ``address`` (a worker's)."""
    import ipaddress
    ip = ipaddress.ip_address(address)
    for t in topo.racks:
        if ip in topo.switch(t).subnet:
            return t
    raise ValueError(f"{address} is in none of the racks {', '.join(topo.racks)}")


def _spine(lab):
    from .lab import SWITCH_PORT
    return (lab.address(lab.topo.spine), SWITCH_PORT)


def lab_tree(lab, members):
    """The ``Tree`` of fabric ``lab`` for workers ``members`` ("ip:port", rank order,
    ranks rack by rack): a leaf per rack that has workers, the spine as root."""
    from ina_fabric.host.switch.tree import Leaf, Tree
    from .lab import SWITCH_PORT
    racks = {}
    for m in members:
        racks.setdefault(rack_of(lab.topo, m.rpartition(":")[0]), []).append(m)
    order = [t for t in lab.topo.racks if t in racks]
    if [m for t in order for m in racks[t]] != list(members):
        raise ValueError("a tree needs its ranks numbered rack by rack")
    return Tree(_spine(lab), tuple(Leaf((lab.address(t), SWITCH_PORT), tuple(racks[t]))
                                   for t in order))


def roles(lab, kind, members) -> list[dict]:
    """Per worker (rank order): ``switch`` ("ip:port" its client sends to), ``worker``
    (its id there) and ``nworkers`` (the job's)."""
    if kind == "flat":
        s = "%s:%d" % _spine(lab)
        return [{"switch": s, "worker": r, "nworkers": len(members)}
                for r in range(len(members))]
    from ina_fabric.host.switch.tree import worker_roles
    return worker_roles(lab_tree(lab, members))


def install_in_lab(lab, kind, job, settings, session, members, node=None, timeout=30.0):
    """Install job ``job`` (``settings``: a ``JobSettings``; ``session``) for workers
    ``members`` on fabric ``lab``: ``kind`` "flat" (the spine's switch, worker r =
    members[r]) or "tree" (``host.switch.tree.install_tree``: leaves, then the spine,
    all or nothing). Runs inside the lab, on host ``node`` (default the first). Returns
    :func:`roles`."""
    _run_in_lab(lab, "install", kind, job, settings, session, members, node, timeout)
    return roles(lab, kind, members)


def remove_in_lab(lab, kind, job, session, members, node=None, timeout=30.0):
    """Remove what :func:`install_in_lab` installed (only while the switches hold
    ``session``), so the job id is free at once for the next run."""
    from ina_fabric.protocol.jobtable import job_defaults
    _run_in_lab(lab, "remove", kind, job, job_defaults("ethernet"), session, members, node,
                timeout)


def _run_in_lab(lab, action, kind, job, settings, session, members, node, timeout):
    if kind not in ("flat", "tree"):
        raise ValueError(f"kind {kind!r}: flat or tree")
    doc = {"action": action, "kind": kind, "job": job, "session": session, "members": list(members),
           "spine": list(_spine(lab)), "window": settings.window,
           "elements": settings.elements, "deadline": settings.deadline,
           "mode": settings.mode}
    if kind == "tree":
        t = lab_tree(lab, members)
        doc["leaves"] = [[list(leaf.switch), list(leaf.workers)] for leaf in t.leaves]
    r = lab.run(node or lab.hosts[0], [sys.executable, "-m", "ina_fabric.host.lab.fabric",
                                       json.dumps(doc)], timeout=timeout)
    if r.returncode:
        from .lab import LabError
        why = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode
        raise LabError(f"{action} job {job} ({kind}) on the fabric: {why}")


def _install_main(argv):
    """``python -m ina_fabric.host.lab.fabric JSON``: what :func:`install_in_lab` runs
    inside the lab."""
    from ina_fabric.protocol.jobtable import JobConfig, JobSettings
    d = json.loads(argv[0])
    s = JobSettings(d["window"], d["elements"], d["deadline"], d["mode"])
    if d["kind"] == "flat":
        from ina_fabric.host.switch import remove_job, send_job
        if d["action"] == "remove":
            remove_job(tuple(d["spine"]), d["job"], d["session"], timeout=2.0)
        else:
            send_job(tuple(d["spine"]), JobConfig.from_settings(
                d["job"], d["members"], s, session=d["session"]), timeout=2.0)
        return 0
    from ina_fabric.host.switch.tree import Leaf, Tree, install_tree, remove_tree
    tree = Tree(tuple(d["spine"]), tuple(Leaf(tuple(a), tuple(w)) for a, w in d["leaves"]))
    if d["action"] == "remove":
        remove_tree(tree, d["job"], d["session"], timeout=2.0)
    else:
        install_tree(tree, d["job"], s, session=d["session"], timeout=2.0)
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(_install_main(sys.argv[1:]))
    except (OSError, ValueError) as e:          # JobRefused and ConfigError are ValueErrors
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        raise SystemExit(1) from None
