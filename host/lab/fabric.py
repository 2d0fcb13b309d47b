"""A job on a fabric lab's switches: flat (one switch, every host a member) or a tree
(each rack's switch sums its hosts, the spine sums the racks; docs/fabric.md).

The plan is pure: :func:`flat_plan` and :func:`tree_plan` turn the workers' addresses,
grouped by rack, into ``[(switch address, JobConfig)]``, root first (a parent holds its
entry before its children send to it); :func:`install` sends each with the switch's
control key. :func:`tree_missing` says why a checkout cannot build trees (None when it
can), so benches and tests leave the tree out with the reason instead of failing.
"""

import dataclasses

__all__ = ["tree_missing", "flat_plan", "tree_plan", "install", "rack_of"]


def tree_missing() -> str | None:
    """None when this checkout has the tree mechanism (issue 38): ``JobConfig`` with a
    parent and child switches, and ``ina switch --parent``; else what is missing."""
    import argparse
    from ina_fabric.protocol.jobtable import JobConfig
    have = {f.name for f in dataclasses.fields(JobConfig)}
    if not {"parent", "index", "children", "workers"} <= have:
        return "JobConfig has no parent/children fields (the tree mechanism, issue 38)"
    from ina_fabric.host.commands import switch as S
    p = argparse.ArgumentParser()
    S.add_arguments(p)
    if not any("--parent" in a.option_strings for a in p._actions):
        return "`ina switch --parent` is not in this checkout (issue 38)"
    return None


def rack_of(topo, address: str) -> str:
    """The top-of-rack switch whose subnet holds ``address`` (a worker's)."""
    import ipaddress
    ip = ipaddress.ip_address(address)
    for t in topo.racks:
        if ip in topo.switch(t).subnet:
            return t
    raise ValueError(f"{address} is in none of the racks {', '.join(topo.racks)}")


def flat_plan(job, workers, spine, settings, session):
    """One switch at ``spine`` ((ip, port)); ``workers``: every worker's "ip:port" in
    rank order."""
    from ina_fabric.protocol.jobtable import JobConfig
    return [(spine, JobConfig.from_settings(job, workers, settings, session=session))]


def tree_plan(job, racks, spine, settings, session):
    """A two-level tree. ``racks``: [(the rack switch's (ip, port), [its workers' "ip:port"
    in rank order])], in rank order (ranks numbered rack by rack). The spine's members are
    the rack switches (member k = rack k, covering its workers); each rack's entry has the
    spine as parent. Worker ranks are global: rank = the rack's first rank + the index in
    its rack."""
    from ina_fabric.protocol.jobtable import JobConfig
    why = tree_missing()
    if why:
        raise NotImplementedError(why)
    s = settings
    total = sum(len(w) for _, w in racks)
    plan = [(spine, JobConfig(job, tuple(f"{a[0]}:{a[1]}" for a, _ in racks), s.window,
                              s.elements, s.deadline, s.mode, None, session, children=True,
                              workers=total))]
    for k, (addr, workers) in enumerate(racks):
        plan.append((addr, JobConfig(job, tuple(workers), s.window, s.elements, s.deadline,
                                     s.mode, None, session, parent=tuple(spine), index=k)))
    return plan


def install(plan, timeout=2.0, key=None):
    """Send each entry of ``plan`` to its switch (root first). Raises JobRefused (the
    switch's reason) or OSError (no answer) naming the switch."""
    from ina_fabric.host.switch import send_job
    for addr, cfg in plan:
        try:
            send_job(tuple(addr), cfg, timeout=timeout, key=key)
        except OSError as e:
            raise OSError(f"switch {addr[0]}:{addr[1]}: {e}") from None
