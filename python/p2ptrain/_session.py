"""The protocol level of the bridge: one session with the daemon.

A :class:`Session` opens the main connection (``hello``), maps the shared memory the daemon names,
opens the callback connection and serves it from a background thread, and speaks the main
connection's messages (``grad``, ``wait``, ``applied``, ``restored``). It knows the messages, not
the model: the callback's state and hash requests go to a :class:`StateProvider`.

An ``averaged`` answer is confirmed by ``applied`` only when it asks for the hash (``want_hash``);
otherwise the process's next message (a ``grad`` or ``wait`` of the next step) confirms it, and a
callback request that comes before carries ``after``: the step count the provider answers from
once the update in progress is done.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Protocol, Tuple, Type

from . import LayoutMismatch, P2PTrainError, ProtocolError, RunStopped
from ._wire import PROTOCOL_VERSION, Connection, Message, Region, SharedMemory, connect, sha256_hex

__all__ = ["StateAnswer", "StateProvider", "Welcome", "Session"]

_LAYOUT_KINDS = ("layout", "version", "busy", "settings")  # refusals and stops that are LayoutMismatch
_MISSING = object()


@dataclass(frozen=True)
class StateAnswer:
    """What the process answers to a callback ``state`` request.

    ``sizes`` is ``(params_bytes, extra_bytes)`` when the state was written; ``None`` when the
    process is not at the step asked (``step`` is then its current step) or could not write it.
    """

    step: int
    sizes: Optional[Tuple[int, int]] = None
    error: str = ""


class StateProvider(Protocol):
    """The process side of the callback connection.

    ``after`` (0: none) is the step count an ``averaged`` answer the process has not confirmed
    told it to reach: when the state is one step short of it, the provider waits for that update
    before answering.
    """

    def write_state(self, step: int, path: str, scratch: Region, after: int) -> StateAnswer:
        """Write the state at ``step`` to ``path`` (parameters, then extra), using ``scratch``."""
        ...  # pragma: no cover

    def current_hash(self, scratch: Region, after: int) -> Tuple[int, str]:
        """The current step and parameter hash, the parameters staged in ``scratch``."""
        ...  # pragma: no cover


@dataclass(frozen=True)
class Welcome:
    """The daemon's acceptance of ``hello``."""

    session: str
    shm: str
    shm_bytes: int
    peer: str
    steps: int
    version: int


def field(message: Message, key: str, kind: Type[Any], default: Any = _MISSING) -> Any:
    """``message[key]``, checked to be a ``kind`` (an int is never a bool); else ProtocolError."""
    if key not in message and default is not _MISSING:
        return default
    value = message.get(key)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ProtocolError(f"malformed message from the daemon: {key!r} is not a {kind.__name__}: {str(message)[:200]}")
    return value


def refusal(message: Message, what: str, otherwise: Type[P2PTrainError] = P2PTrainError) -> P2PTrainError:
    """The exception for a refusal (``ok: false``) or a ``stopped`` answer, carrying the daemon's text.

    :class:`LayoutMismatch` for the kinds ``layout``, ``version``, ``busy`` and ``settings``; an
    ``otherwise`` for any other kind.
    """
    kind = message.get("kind")
    text = f"the daemon {what} ({kind}): {message.get('error', '')}"
    return LayoutMismatch(text) if kind in _LAYOUT_KINDS else otherwise(text)


def _accepted(answer: Message, what: str) -> Message:
    if field(answer, "ok", bool):
        return answer
    raise refusal(answer, what)


class Session:
    """One session with the daemon: both connections, the shared memory and the callback thread."""

    def __init__(
        self,
        path: str,
        timeout: Optional[float],
        provider: StateProvider,
        *,
        params: List[Dict[str, Any]],
        buckets: List[List[int]],
        settings: Dict[str, str],
        step: int,
        flat: Region,
    ) -> None:
        """Say ``hello`` on ``path``, map the shared memory and start serving the callback connection.

        ``flat`` holds the parameters at ``step`` in flat order: ``hello`` carries their hash, and
        they are copied into the parameter region before the callback connection opens, since the
        daemon takes that region to hold the parameters of the last hash the process sent.
        """
        self._provider = provider
        self._closing = False
        self._callback_error: Optional[str] = None
        self._callback: Optional[Connection] = None
        self.shm: Optional[SharedMemory] = None
        self._main = Connection(connect(path, timeout), "main")
        try:
            self._main.send(
                {
                    "op": "hello",
                    "version": PROTOCOL_VERSION,
                    "role": "main",
                    "pid": os.getpid(),
                    "params": params,
                    "buckets": buckets,
                    "settings": settings,
                    "step": step,
                    "hash": sha256_hex(flat.raw),
                }
            )
            self.welcome = self._welcome(self._main.recv(), flat.tensor.numel())
            self.shm = SharedMemory(self.welcome.shm, self.welcome.shm_bytes)
            self.shm.params.tensor.copy_(flat.tensor)
            self._callback = self._open_callback(path, timeout)
        except BaseException:
            self.close()
            raise
        self._thread = threading.Thread(target=self._serve_callbacks, name="p2ptrain-callback", daemon=True)
        self._thread.start()

    # --- opening ---------------------------------------------------------------------------------

    @staticmethod
    def _welcome(answer: Message, numel: int) -> Welcome:
        _accepted(answer, "refused this process")
        welcome = Welcome(
            session=field(answer, "session", str),
            shm=field(answer, "shm", str),
            shm_bytes=field(answer, "shm_bytes", int),
            peer=field(answer, "peer", str),
            steps=field(answer, "steps", int),
            version=field(answer, "version", int, PROTOCOL_VERSION),
        )
        if welcome.shm_bytes != 8 * numel:
            raise ProtocolError(f"the daemon's shared memory has {welcome.shm_bytes} bytes, not 8·{numel}")
        if welcome.version != PROTOCOL_VERSION:
            raise ProtocolError(f"the daemon speaks protocol version {welcome.version}, not {PROTOCOL_VERSION}")
        return welcome

    def _open_callback(self, path: str, timeout: Optional[float]) -> Connection:
        callback = Connection(connect(path, timeout), "callback")
        try:
            callback.send({"op": "hello", "version": PROTOCOL_VERSION, "role": "callback", "session": self.welcome.session})
            _accepted(callback.recv(), "refused the callback connection")
        except BaseException:
            callback.close()
            raise
        callback.settimeout(None)  # the daemon asks whenever it needs to
        return callback

    # --- the main connection ---------------------------------------------------------------------

    def grad(self, step: int, bucket: int) -> None:
        """Announce that bucket ``bucket``'s gradient of step ``step`` is in shared memory."""
        self._send({"op": "grad", "step": step, "bucket": bucket})

    def wait(self, step: int, loss: Optional[float]) -> Message:
        """Wait for step ``step``'s outcome: an ``averaged``, ``restore`` or ``finished`` answer.

        A ``stopped`` answer raises :class:`LayoutMismatch` (kind ``settings``) or
        :class:`RunStopped`.
        """
        message: Message = {"op": "wait", "step": step}
        if loss is not None:
            message["loss"] = loss
        self._send(message)
        return self._outcome(self._recv(), step)

    def applied(self, step: int, digest: str) -> None:
        """Report that step ``step``'s average was applied, with the hash after it.

        Only for an ``averaged`` answer with ``want_hash``: any other is confirmed by the next
        step's first message.
        """
        self._send({"op": "applied", "step": step, "hash": digest})

    def restored(self, step: int, digest: str) -> None:
        """Report that the state of step ``step`` was loaded; ``digest`` is the hash after loading."""
        self._send({"op": "restored", "step": step, "hash": digest})

    @staticmethod
    def _outcome(answer: Message, step: int) -> Message:
        status = answer.get("status")
        if status == "averaged":
            if field(answer, "step", int) != step:
                raise ProtocolError(f"the daemon averaged step {answer['step']} for a wait of step {step}")
            answer["want_hash"] = field(answer, "want_hash", bool, False)
        elif status == "restore":
            for key in ("step", "params_bytes", "extra_bytes"):
                if field(answer, key, int) < 0:
                    raise ProtocolError(f"negative {key} in {answer}")
            field(answer, "path", str)
        elif status == "finished":
            field(answer, "step", int, step)
        elif status == "stopped":
            raise refusal(answer, "stopped the run", RunStopped)
        else:
            raise ProtocolError(f"unknown answer to wait: {str(answer)[:200]}")
        return answer

    def _send(self, message: Message) -> None:
        try:
            self._main.send(message)
        except RunStopped as exc:
            raise self._with_context(exc) from None

    def _recv(self) -> Message:
        try:
            return self._main.recv()
        except RunStopped as exc:
            raise self._with_context(exc) from None

    def _with_context(self, exc: RunStopped) -> RunStopped:
        if self._callback_error is None:
            return exc
        return RunStopped(f"{exc} (the callback connection failed first: {self._callback_error})")

    # --- the callback connection -----------------------------------------------------------------

    def _serve_callbacks(self) -> None:
        assert self._callback is not None
        try:
            while True:
                self._callback.send(self._answer(self._callback.recv()))
        except RunStopped as exc:  # the connection closed or failed
            if not self._closing:
                self._callback_error = str(exc)
        except Exception as exc:  # a malformed request, or a failure answering it
            self._callback_error = f"{type(exc).__name__}: {exc}"
            self._main.close()  # end the session now: the main thread must not wait forever
        finally:
            self._callback.close()

    def _answer(self, request: Message) -> Message:
        assert self.shm is not None
        op = request.get("op")
        after = field(request, "after", int, 0)
        if op == "state":
            step, path = field(request, "step", int), field(request, "path", str)
            answer = self._provider.write_state(step, path, self.shm.params, after)
            if answer.sizes is None:
                return {"ok": False, "step": answer.step, "error": answer.error or f"at step {answer.step}"}
            return {"ok": True, "step": answer.step, "params_bytes": answer.sizes[0], "extra_bytes": answer.sizes[1]}
        if op == "hash":
            step, digest = self._provider.current_hash(self.shm.params, after)
            return {"ok": True, "step": step, "hash": digest}
        raise ProtocolError(f"unknown op {op!r} on the callback connection")

    # --- closing ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Close both connections (which ends the session for the daemon) and stop the thread."""
        self._closing = True
        self._main.close()
        if self._callback is not None:
            self._callback.close()
        thread = getattr(self, "_thread", None)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)
        if self.shm is not None:
            self.shm.close()
            self.shm = None
