"""p2ptrain: the Python side of p2ptrain's PyTorch bridge.

The daemon (``p2ptrain join --trainer external``) all-reduces the gradients of a model that lives in
a training script on the same machine. :mod:`p2ptrain.torch` is the script's side; the wire protocol
is described in ``docs/pytorch.md``.

This module holds the package version and the exceptions every part of the package raises.
"""

from __future__ import annotations

__all__ = [
    "__version__",
    "P2PTrainError",
    "DaemonNotRunning",
    "LayoutMismatch",
    "RunStopped",
    "ProtocolError",
]

__version__ = "0.1.0"


class P2PTrainError(Exception):
    """Base class of every error raised by p2ptrain."""


class DaemonNotRunning(P2PTrainError):
    """No daemon listens on the socket: the socket file is missing or refuses connections.

    The message names the path that was tried and how to start the daemon.
    """


class LayoutMismatch(P2PTrainError):
    """The daemon refused this process's layout, protocol version or settings, or is busy.

    Raised when ``hello`` is refused (kind ``layout``, ``version`` or ``busy``) or when the run is
    stopped with kind ``settings``. The message carries the daemon's text, which names the keys that
    differ.
    """


class RunStopped(P2PTrainError):
    """The run stopped: the daemon answered ``stopped``, or a connection to it was lost mid-run."""


class ProtocolError(P2PTrainError):
    """The daemon sent a message that breaks the protocol (malformed, out of turn, or out of bounds)."""
