"""The wire level of the bridge: message framing, the socket path, connections, shared memory.

A message is a 4-byte little-endian length ``n`` (1 <= n <= 16 MiB) followed by ``n`` bytes of one
UTF-8 JSON object. Gradients and parameters travel as little-endian float32 in a shared-memory file
that the daemon creates and this process maps.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import socket
import struct
import sys
from typing import Any, Dict, Mapping, NamedTuple, Optional, Union

import torch

from . import DaemonNotRunning, P2PTrainError, ProtocolError, RunStopped

if sys.byteorder != "little":  # pragma: no cover - every supported host is little-endian
    raise ImportError("p2ptrain exchanges little-endian float32 in shared memory; this host is big-endian")

__all__ = [
    "PROTOCOL_VERSION",
    "MAX_MESSAGE_BYTES",
    "DEFAULT_API_PORT",
    "Message",
    "encode_message",
    "decode_body",
    "send_message",
    "recv_message",
    "socket_path",
    "connect",
    "Connection",
    "Region",
    "region_over",
    "scratch_region",
    "SharedMemory",
    "sha256_hex",
]

PROTOCOL_VERSION = 2
"""The protocol version this package speaks (``"version"`` of ``hello``).

Version 2: ``applied`` only answers an ``averaged`` that asked for the hash, and callback requests
carry ``after``."""

MAX_MESSAGE_BYTES = 16 << 20
"""The largest message body, in bytes, either side accepts."""

DEFAULT_API_PORT = 7420
"""The default port of the daemon's ``node.api``, which names its default socket."""

Message = Dict[str, Any]
"""One decoded protocol message: a JSON object."""

_LENGTH = struct.Struct("<I")


# --- framing -----------------------------------------------------------------------------------


def _check_length(n: int) -> None:
    if not 1 <= n <= MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message length {n} is outside [1, {MAX_MESSAGE_BYTES}]")


def encode_message(message: Mapping[str, Any]) -> bytes:
    """Frame one message: its length prefix and its compact, strict JSON body.

    Raises :class:`ProtocolError` when the body would exceed 16 MiB and ``ValueError`` when the
    message holds a non-finite float (strict JSON has none).
    """
    body = json.dumps(message, allow_nan=False, separators=(",", ":")).encode("utf-8")
    _check_length(len(body))
    return _LENGTH.pack(len(body)) + body


def decode_body(body: bytes) -> Message:
    """Decode one message body; anything but a UTF-8 JSON object raises :class:`ProtocolError`."""
    try:
        message = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(f"malformed message: {exc}") from None
    if not isinstance(message, dict):
        raise ProtocolError(f"malformed message: a JSON {type(message).__name__}, not an object")
    return message


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise RunStopped("the connection was closed" + (" mid-message" if got else ""))
        got += k
    return bytes(buf)


def send_message(sock: socket.socket, message: Mapping[str, Any]) -> None:
    """Send one framed message on ``sock``."""
    sock.sendall(encode_message(message))


def recv_message(sock: socket.socket) -> Message:
    """Receive one framed message from ``sock``.

    Raises :class:`RunStopped` when the other side closes the connection and
    :class:`ProtocolError` for a bad length or body.
    """
    (n,) = _LENGTH.unpack(_recv_exactly(sock, _LENGTH.size))
    _check_length(n)
    return decode_body(_recv_exactly(sock, n))


# --- the socket --------------------------------------------------------------------------------

PathArg = Union[str, "os.PathLike[str]"]


def socket_path(explicit: Optional[PathArg] = None, environ: Optional[Mapping[str, str]] = None) -> str:
    """The daemon's socket: ``explicit``, else ``$P2PTRAIN_SOCKET``, else the default for port 7420.

    The default is ``$XDG_RUNTIME_DIR/p2ptrain-7420.sock`` when ``XDG_RUNTIME_DIR`` is set (and not
    empty), else ``/tmp/p2ptrain-<uid>/7420.sock``. ``environ`` defaults to ``os.environ``.
    """
    env = os.environ if environ is None else environ
    if explicit:
        return os.fspath(explicit)
    if env.get("P2PTRAIN_SOCKET"):
        return env["P2PTRAIN_SOCKET"]
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime:
        return os.path.join(runtime, f"p2ptrain-{DEFAULT_API_PORT}.sock")
    return f"/tmp/p2ptrain-{os.getuid()}/{DEFAULT_API_PORT}.sock"


def connect(path: str, timeout: Optional[float]) -> socket.socket:
    """Connect to the daemon's socket at ``path``.

    Raises :class:`DaemonNotRunning` when the socket is missing or refuses the connection, and
    :class:`P2PTrainError` for any other failure (for instance a socket owned by another user).
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        sock.close()
        raise DaemonNotRunning(
            f"no p2ptrain daemon listens on {path} ({exc.strerror}); start one with "
            "`p2ptrain join --trainer external ...`, and if it uses another train.socket, pass "
            "socket= or set P2PTRAIN_SOCKET"
        ) from None
    except OSError as exc:
        sock.close()
        raise P2PTrainError(f"cannot connect to the p2ptrain daemon at {path}: {exc}") from None
    return sock


class Connection:
    """One connection to the daemon, whose failures are reported as :class:`RunStopped`."""

    def __init__(self, sock: socket.socket, name: str) -> None:
        """Wrap ``sock``; ``name`` (``"main"`` or ``"callback"``) appears in error messages."""
        self._sock = sock
        self.name = name

    def settimeout(self, timeout: Optional[float]) -> None:
        """Bound every later receive by ``timeout`` seconds (``None``: wait forever)."""
        self._sock.settimeout(timeout)

    def send(self, message: Mapping[str, Any]) -> None:
        """Send one message."""
        data = encode_message(message)
        try:
            self._sock.sendall(data)
        except OSError as exc:
            raise RunStopped(f"lost the {self.name} connection to the daemon: {exc}") from None

    def recv(self) -> Message:
        """Receive one message."""
        try:
            return recv_message(self._sock)
        except socket.timeout:
            raise RunStopped(
                f"no answer from the daemon within {self._sock.gettimeout()} s on the {self.name} connection"
            ) from None
        except RunStopped as exc:
            raise RunStopped(f"lost the {self.name} connection to the daemon: {exc}") from None
        except OSError as exc:
            raise RunStopped(f"lost the {self.name} connection to the daemon: {exc}") from None

    def close(self) -> None:
        """Close the connection; a thread blocked in :meth:`recv` on it wakes up with an error."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()


# --- float32 regions and shared memory ---------------------------------------------------------


class Region(NamedTuple):
    """A run of float32 values seen two ways: a 1-D tensor and the raw bytes under it."""

    tensor: torch.Tensor
    raw: memoryview


def region_over(buffer: memoryview) -> Region:
    """A :class:`Region` over a writable buffer whose length is a positive multiple of 4.

    The tensor keeps the buffer alive (and, for a memory map, keeps it mapped).
    """
    return Region(torch.frombuffer(buffer, dtype=torch.float32), buffer)


def scratch_region(numel: int) -> Region:
    """A :class:`Region` of ``numel`` float32 values in private memory."""
    return region_over(memoryview(bytearray(4 * numel)))


def sha256_hex(raw: memoryview) -> str:
    """Lowercase hex SHA-256 of ``raw``: the parameter hash when ``raw`` holds the flat parameters."""
    return hashlib.sha256(raw).hexdigest()


class SharedMemory:
    """The session's shared-memory file: the gradient region then the parameter region.

    The file is mapped once; both regions are views of that mapping. The mapping is never closed
    explicitly: it is unmapped when the last view of it is garbage-collected, so a view can never
    point at unmapped memory.
    """

    def __init__(self, path: str, nbytes: int) -> None:
        """Map the first ``nbytes`` (``8·N``) of the file at ``path``, read-write and shared."""
        if nbytes <= 0 or nbytes % 8:
            raise ProtocolError(f"shared memory of {nbytes} bytes is not 8 bytes per parameter")
        try:
            fd = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise ProtocolError(f"cannot open the daemon's shared memory {path}: {exc}") from None
        try:
            size = os.fstat(fd).st_size
            if size < nbytes:
                raise ProtocolError(f"shared memory {path} has {size} bytes, the daemon announced {nbytes}")
            mapping = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        whole = memoryview(mapping)
        half = nbytes // 2
        self.path = path
        self.grads: Region = region_over(whole[:half])
        self.params: Region = region_over(whole[half:])

    def close(self) -> None:
        """Drop this object's views; the mapping goes when the last view is gone."""
        del self.grads, self.params
