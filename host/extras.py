"""The package's extras (pyproject.toml's optional dependencies), as the verbs check them:
before any work, one line naming the ``pip install`` that brings what is missing."""

__all__ = ["EXTRAS", "missing_extra", "require_extras"]

#: the modules each extra of pyproject.toml brings (the ones a verb imports)
EXTRAS = {
    "torch": ("torch", "sklearn", "scipy", "tqdm"),
    "plot": ("matplotlib",),
    "hw": ("amaranth",),
    "sim": ("cocotb", "cocotbext.eth"),
    "lab": ("pyroute2",),
    "watch": ("prometheus_client", "rich"),
}


def missing_extra(module: str) -> str | None:
    """The extra that brings ``module`` (a top-level or dotted name), or None."""
    top = module.split(".")[0]
    for extra, mods in EXTRAS.items():
        if any(m.split(".")[0] == top for m in mods):
            return extra
    return None


def require_extras(*extras: str, what: str = ""):
    """Before any work: a one-line CliError naming the ``pip install`` that brings a
    module of ``extras`` that is not installed (``what``: the option that needs it, as
    ``--plot``; empty: the verb itself)."""
    import importlib.util
    from .cli import CliError
    for extra in extras:
        for mod in EXTRAS[extra]:
            try:
                found = importlib.util.find_spec(mod) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                raise CliError(f"{what + ' ' if what else ''}needs the {extra} extra "
                               f"({mod} is not installed): pip install "
                               f"'ina-fabric[{extra}]'")
