"""A job on a tree of switches (docs/fabric.md): what each switch's entry is, installing
all of them (each sealed with that switch's own control key), and reading a stall level
by level.

``Tree``: the spine's address and the leaves (each its address, its workers, and where
its control key is). ``tree_jobs`` gives each switch's ``JobConfig``; ``install_tree``
sends them (leaves first, the spine last, all or nothing: a refusal removes what was
installed and raises); ``tree_status`` asks every switch and names who a job waits for,
per level; ``worker_roles`` says what each worker passes its client (its leaf, its id
there, the job's worker count). ``load_tree_toml`` reads the file ``ina switch
--install-tree`` takes.
"""

from dataclasses import dataclass, field, replace
import tomllib

from ina_fabric.protocol.jobtable import (JobConfig, JobSettings, Member, ConfigError,
                                          new_session)

__all__ = ["Tree", "Leaf", "tree_jobs", "install_tree", "remove_tree", "tree_status",
           "worker_roles", "load_tree_toml", "SPINE_DEADLINE_FACTOR"]

#: the spine's deadline, unless given: this many times the leaves' (it must be longer, so
#: that a leaf's partial sum, sent at the leaf's deadline, still reaches the spine)
SPINE_DEADLINE_FACTOR = 2.0


@dataclass(frozen=True)
class Leaf:
    switch: tuple[str, int]
    workers: tuple[str, ...]           # "ip:port", worker w at this leaf is workers[w]
    key_file: str | None = None        # its control key (None: the default key)


@dataclass(frozen=True)
class Tree:
    spine: tuple[str, int]
    leaves: tuple[Leaf, ...]
    spine_key_file: str | None = None

    @property
    def workers(self) -> int:
        return sum(len(leaf.workers) for leaf in self.leaves)


def tree_jobs(tree: Tree, job: int, settings: JobSettings, session: int | None = None,
              spine_deadline: float | None = None) -> dict:
    """{switch address: JobConfig} for every switch of ``tree``. Raises ConfigError (one
    line) for a tree past the limits (32 leaves, 32 workers each, 1,024 in all) or a
    spine deadline not longer than the leaves'."""
    session = session or new_session()
    sd = settings.deadline * SPINE_DEADLINE_FACTOR if spine_deadline is None else \
        spine_deadline
    if settings.mode != "reliable" and sd <= settings.deadline:
        raise ConfigError(f"job {job}: spine deadline {sd * 1e3:g} ms must be longer than "
                          f"the leaves' {settings.deadline * 1e3:g} ms (a leaf's partial "
                          f"sum leaves at the leaf's deadline)")
    spine = JobConfig.from_settings(
        job, [f"{a}:{p}" for a, p in (leaf.switch for leaf in tree.leaves)],
        replace(settings, deadline=sd), session=session)
    spine = replace(spine, children=True, workers=tree.workers)
    out = {tuple(tree.spine): spine}
    for i, leaf in enumerate(tree.leaves):
        cfg = JobConfig.from_settings(job, leaf.workers, settings, session=session)
        out[tuple(leaf.switch)] = replace(cfg, parent=tuple(tree.spine), index=i)
    if len(out) != len(tree.leaves) + 1:
        raise ConfigError(f"job {job}: two switches of the tree share an address")
    return out


def _keys(tree: Tree, default_key_file=None) -> dict:
    from .keys import switch_key
    paths = {tuple(tree.spine): tree.spine_key_file}
    paths.update({tuple(leaf.switch): leaf.key_file for leaf in tree.leaves})
    return {a: switch_key(path=p or default_key_file) for a, p in paths.items()}


def install_tree(tree: Tree, job: int, settings: JobSettings, session=None,
                 spine_deadline=None, key_file=None, timeout=1.0) -> dict:
    """Install the job on every switch of ``tree``, each entry sealed with that switch's
    key (``Leaf.key_file``, ``Tree.spine_key_file``; else ``key_file``, else the default
    key). Leaves first, the spine last; if one refuses (or does not answer), the entries
    already installed are removed (with this session) and the error is raised:
    ``JobRefused`` or ``OSError``, naming the switch. Returns the configs installed."""
    from ina_fabric.protocol.control_client import send_job, remove_job, JobRefused
    jobs = tree_jobs(tree, job, settings, session, spine_deadline)
    keys = _keys(tree, key_file)
    order = [tuple(leaf.switch) for leaf in tree.leaves] + [tuple(tree.spine)]
    done = []
    try:
        for addr in order:
            try:
                send_job(addr, jobs[addr], timeout=timeout, key=keys[addr])
            except JobRefused as e:
                raise JobRefused(f"switch {addr[0]}:{addr[1]}: {e}") from None
            except OSError as e:
                raise OSError(f"switch {addr[0]}:{addr[1]} did not answer (is it up, with "
                              f"this key?): {e}") from None
            done.append(addr)
    except BaseException:
        for addr in done:
            try:
                remove_job(addr, job, jobs[addr].session, timeout=timeout, key=keys[addr])
            except (OSError, JobRefused):
                pass
        raise
    return jobs


def remove_tree(tree: Tree, job: int, session: int = 0, key_file=None, timeout=1.0):
    """Remove the job from every switch of the tree (errors ignored, as a clean-up)."""
    from ina_fabric.protocol.control_client import remove_job, JobRefused
    for addr, key in _keys(tree, key_file).items():
        try:
            remove_job(addr, job, session, timeout=timeout, key=key)
        except (OSError, JobRefused):
            pass


def worker_roles(tree: Tree) -> list[dict]:
    """For each worker, in rack order: its address, its switch (its leaf), its worker id
    there and the job's worker count (what its ``SwitchClient`` takes)."""
    n = tree.workers
    return [{"addr": w, "switch": f"{leaf.switch[0]}:{leaf.switch[1]}", "rack": i,
             "worker": k, "nworkers": n}
            for i, leaf in enumerate(tree.leaves) for k, w in enumerate(leaf.workers)]


def tree_status(tree: Tree, job: int, key_file=None, timeout=1.0) -> dict:
    """STATUS of the job on every switch, read level by level: the spine's
    ``waiting_for`` as racks, each leaf's as workers (their addresses), the slots each
    leaf has sent up and waits on; a switch that does not answer is named as such."""
    from ina_fabric.protocol.control_client import query_status
    keys = _keys(tree, key_file)

    def ask(addr):
        try:
            st = query_status(tuple(addr), timeout=timeout, key=keys[tuple(addr)])
        except OSError as e:
            return {"error": f"no answer: {e}"}
        return st["jobs"].get(str(job)) or st["jobs"].get(job) or {"error": "job not "
                                                                          "installed"}
    spine = ask(tree.spine)
    out = {"spine": {"switch": f"{tree.spine[0]}:{tree.spine[1]}", **spine,
                     "waiting_for_racks": [
                         {"rack": r, "switch": "%s:%d" % tuple(tree.leaves[r].switch)}
                         for r in spine.get("waiting_for", []) if r < len(tree.leaves)]},
           "racks": []}
    for i, leaf in enumerate(tree.leaves):
        st = ask(leaf.switch)
        out["racks"].append({"rack": i, "switch": f"{leaf.switch[0]}:{leaf.switch[1]}",
                             **st, "waiting_for_workers": [
                                 {"worker": w, "addr": leaf.workers[w]}
                                 for w in st.get("waiting_for", [])
                                 if w < len(leaf.workers)]})
    return out


def _addr(text, what):
    m = Member.parse(text)
    return m.addr


def load_tree_toml(path) -> Tree:
    """A tree from TOML::

        spine = "198.18.0.1:19900"
        spine_key_file = "spine.key"          # optional
        [[leaf]]
        switch = "198.18.1.1:19900"
        workers = ["198.18.1.10:20000", "198.18.1.11:20000"]
        key_file = "rack0.key"                # optional

    Raises ConfigError (one line) for anything missing or malformed."""
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{path}: {e}") from None
    unknown = set(doc) - {"spine", "spine_key_file", "leaf"}
    if unknown:
        raise ConfigError(f"{path}: unknown keys {sorted(unknown)}")
    if "spine" not in doc or not doc.get("leaf"):
        raise ConfigError(f"{path}: needs spine = \"ip:port\" and [[leaf]] tables")
    leaves = []
    for t in doc["leaf"]:
        unknown = set(t) - {"switch", "workers", "key_file"}
        if unknown:
            raise ConfigError(f"{path}: unknown leaf keys {sorted(unknown)}")
        if "switch" not in t or not isinstance(t.get("workers"), list) or not t["workers"]:
            raise ConfigError(f"{path}: each [[leaf]] needs switch and a list of workers")
        leaves.append(Leaf(_addr(t["switch"], "leaf"), tuple(t["workers"]),
                           t.get("key_file")))
    return Tree(_addr(doc["spine"], "spine"), tuple(leaves), doc.get("spine_key_file"))
