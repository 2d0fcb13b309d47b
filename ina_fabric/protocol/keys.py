"""Where the switch's control key comes from (the format: ``ina_fabric.protocol.auth``).

In order: the ``INA_SWITCH_KEY`` environment variable (64 hex digits), else the file
``INA_SWITCH_KEY_FILE`` names, else ``~/.config/ina-fabric/switch.key``. A switch
started here creates that file (mode 0600) when it is missing, so the tools of one user
on one machine (or a shared home) agree without set-up (a client asking first creates it
just the same); across machines, give every host
that configures the switch the same key (torchrun: ``INA_SWITCH_KEY`` in rank 0's
environment).
"""

import os
import pathlib
import secrets

__all__ = ["switch_key", "default_key_path", "KeyMissing"]


class KeyMissing(ValueError):
    """No control key was found."""


def default_key_path() -> pathlib.Path:
    p = os.environ.get("INA_SWITCH_KEY_FILE")
    return pathlib.Path(p) if p else pathlib.Path.home() / ".config" / "ina-fabric" / \
        "switch.key"


def _parse(text: str, where: str) -> bytes:
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        raise KeyMissing(f"{where}: not hex") from None
    if len(key) < 16:
        raise KeyMissing(f"{where}: a key needs at least 16 bytes (32 hex digits)")
    return key


def switch_key(create: bool = False, path=None) -> bytes:
    """The control key. ``create=True`` (a switch starting) writes a new random key to
    the key file when there is none. Raises KeyMissing with what to do."""
    if path is None and os.environ.get("INA_SWITCH_KEY"):
        return _parse(os.environ["INA_SWITCH_KEY"], "INA_SWITCH_KEY")
    p = pathlib.Path(path) if path else default_key_path()
    try:
        return _parse(p.read_text(), str(p))
    except FileNotFoundError:
        if not create:
            raise KeyMissing(f"no switch control key: set INA_SWITCH_KEY, or INA_SWITCH_KEY_FILE, "
                             f"or start `ina switch` on this machine once (it creates {p})") \
                from None
    p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(secrets.token_hex(32) + "\n")
    try:
        os.link(tmp, p)          # atomic: a switch starting beside us may win the race
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return _parse(p.read_text(), str(p))
