"""One line per failure (issue 43): how a process that runs INA code ends.

Under torchrun every rank that fails prints its traceback, and two ranks' tracebacks
interleave: a one-line reason ("INA: no switch answered at ...") hid inside about 100
lines. ``install()`` (done when the DDP hook or the ``ina`` backend is imported) makes an
uncaught error that INA raised for a reason the user can act on (an ``OSError``,
``ValueError``, ``RuntimeError`` or ``TimeoutError`` whose innermost frame is INA's
code) print one line, ``rank R: Type: message``, with no traceback unless
``INA_DEBUG=1``; every other error (a bug, the user's own code) keeps its traceback.
Ctrl-C ends such a process quietly (``interrupted``), in every rank.

``quiet_child()``: the worker processes the ``ina`` verbs fork ignore Ctrl-C; the verb's
own process takes it, ends them and exits quietly (``host.cli``), so one Ctrl-C gives
no traceback from any of them.
"""

import os
import signal
import sys

__all__ = ["install", "quiet_child", "is_ours", "one_line"]

#: error types INA raises for a reason the user can act on (bugs raise others)
_ACTIONABLE = (OSError, ValueError, RuntimeError, TimeoutError)
#: subclasses of those that are never the user's to fix: a path that does not exist is a
#: bug (RuntimeError's subclass for it), and keeps its traceback. Not a marker of work
#: left: no INA code raises it; it guards what a library raises through INA's frames
_NOT_ACTIONABLE = (NotImplementedError, RecursionError)
_ROOTS = tuple(os.path.dirname(os.path.abspath(p)) + os.sep for p in (
    __file__, __import__("ina_fabric").__file__))
_previous = None


def is_ours(exc: BaseException) -> bool:
    """An actionable error raised in INA's code (its innermost frame)."""
    if not isinstance(exc, _ACTIONABLE) or isinstance(exc, _NOT_ACTIONABLE):
        return False
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    path = os.path.abspath(tb.tb_frame.f_code.co_filename)
    return path.startswith(_ROOTS)


def one_line(exc: BaseException) -> str:
    rank = os.environ.get("RANK")
    text = " ".join(str(exc).split())        # one line, whatever the message held
    return f"{'rank ' + rank + ': ' if rank else ''}{type(exc).__name__}: {text}"


def _say(line: str):
    """``line`` and its newline in one write: ``print`` writes them apart on an
    unbuffered stderr, so two ranks' lines under torchrun came out as one line."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _hook(exc_type, exc, tb):
    if os.environ.get("INA_DEBUG", "") not in ("", "0"):
        return _previous(exc_type, exc, tb)
    if issubclass(exc_type, KeyboardInterrupt):
        rank = os.environ.get("RANK")
        _say(f"{'rank ' + rank + ': ' if rank else ''}interrupted")
        return None
    if exc is not None and is_ours(exc):
        _say(one_line(exc) + " (INA_DEBUG=1 shows the traceback)")
        return None
    return _previous(exc_type, exc, tb)


def install():
    """Make this process's uncaught INA errors one line (idempotent)."""
    global _previous
    if sys.excepthook is not _hook:
        _previous = sys.excepthook
        sys.excepthook = _hook


def quiet_child():
    """In a worker process of an ``ina`` verb: Ctrl-C is the parent's to handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def stop_on_signals(stop):
    """A server's loop (``ina switch``): ``stop()`` on SIGTERM and on SIGINT, unless
    SIGINT is ignored. A process started with SIGINT ignored keeps ignoring it, as Unix
    programs do (a background job, ``nohup``), and so does a switch that an ``ina`` verb
    forked (``quiet_child``): its parent takes the Ctrl-C and ends it. Catching SIGINT
    there let a Ctrl-C that the parent ignored end the switch under its workers, which
    then waited out their stall timeout."""
    signal.signal(signal.SIGTERM, lambda *_: stop())
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, lambda *_: stop())
