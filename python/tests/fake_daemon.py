"""A fake p2ptrain daemon: the daemon's side of docs/pytorch.md's protocol, for the tests.

It listens on a Unix socket in a temporary directory and serves one session at a time from
threads. It averages nothing: by default it answers each ``wait`` by multiplying the gradient region
by ``factor`` and saying ``averaged``. Tests script other answers with :meth:`FakeDaemon.answer`,
ask callback requests with :meth:`FakeDaemon.request`, and wait for what the process sent with
:meth:`FakeDaemon.expect`. Protocol violations it sees are collected in ``errors``.
"""

from __future__ import annotations

import math
import mmap
import os
import socket
import tempfile
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from p2ptrain import RunStopped
from p2ptrain._wire import PROTOCOL_VERSION, recv_message, send_message

Message = Dict[str, Any]
WaitHandler = Callable[["FakeDaemon", Message], Optional[Message]]

TIMEOUT = 10.0
"""Seconds any test waits for the other side before failing (never reached when all is well)."""

DROP: Message = {"__drop__": True}
"""A wait answer that makes the daemon close the main connection instead of answering."""


def averaged(want_hash: bool = False) -> WaitHandler:
    """A wait handler: multiply the gradient region by the daemon's factor and say ``averaged``."""

    def handle(daemon: "FakeDaemon", wait: Message) -> Message:
        daemon.grads().mul_(daemon.factor)
        return {"status": "averaged", "step": wait["step"], "want_hash": want_hash}

    return handle


def fixed(answer: Message) -> WaitHandler:
    """A wait handler that answers ``answer`` (or drops the connection for :data:`DROP`)."""
    return lambda daemon, wait: answer


class FakeDaemon:
    """The daemon's side of the protocol on a Unix socket in a temporary directory."""

    def __init__(self, *, steps: int = 100, factor: float = 0.5, refuse: Optional[Message] = None) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="p2ptrain-test-")
        self.dir = self._tmp.name
        self.path = os.path.join(self.dir, "daemon.sock")
        self.steps = steps
        self.factor = factor
        self.refuse = refuse
        self.errors: List[str] = []
        self.hello: Optional[Message] = None
        self.messages: List[Message] = []  # every message on the main connection after hello
        self.snapshots: List[Tuple[int, int, bytes]] = []  # (step, bucket, its bytes) at each grad
        self.step = 0
        self._hash_asked: Optional[int] = None  # the step whose averaged answer asked for "applied"
        self._handlers: List[WaitHandler] = []
        self._cond = threading.Condition()
        self._callback: Optional[socket.socket] = None
        self._callback_ready = threading.Event()
        self._conns: List[socket.socket] = []
        self._threads: List[threading.Thread] = []
        self._mapping: Optional[mmap.mmap] = None
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(4)
        self._spawn(self._accept_loop)

    # --- the test's side -------------------------------------------------------------------------

    def answer(self, *handlers: WaitHandler) -> None:
        """Answer the next waits with ``handlers``, in order (then :func:`averaged` again)."""
        with self._cond:
            self._handlers.extend(handlers)

    def expect(self, op: str, count: int = 1) -> List[Message]:
        """Wait until ``count`` messages ``op`` arrived on the main connection; return them all."""
        with self._cond:
            ok = self._cond.wait_for(lambda: len(self.ops(op)) >= count, timeout=TIMEOUT)
        assert ok, f"expected {count} {op!r}, got {self.messages}"
        return self.ops(op)

    def ops(self, op: str) -> List[Message]:
        """The messages ``op`` received so far."""
        return [m for m in self.messages if m.get("op") == op]

    def request(self, message: Message) -> Optional[Message]:
        """Send a request on the callback connection; its answer, or ``None`` if it was closed."""
        assert self._callback_ready.wait(TIMEOUT), "no callback connection"
        assert self._callback is not None
        send_message(self._callback, message)
        try:
            return recv_message(self._callback)
        except RunStopped:
            return None

    def grads(self) -> torch.Tensor:
        """The gradient region, as float32."""
        assert self._mapping is not None
        return torch.frombuffer(self._mapping, dtype=torch.float32, count=self._numel)

    def param_region(self) -> bytes:
        """The bytes of the parameter region."""
        assert self._mapping is not None
        return bytes(self._mapping[4 * self._numel : 8 * self._numel])

    def wait_closed(self) -> None:
        """Wait until the main connection ended."""
        with self._cond:
            assert self._cond.wait_for(lambda: self._main_closed, timeout=TIMEOUT), "main connection still open"

    def close(self) -> None:
        """Stop listening, close every connection and join the threads."""
        for sock in [self._listener, *self._conns]:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        for thread in self._threads:
            thread.join(TIMEOUT)
        self._mapping = None
        self._tmp.cleanup()

    # --- serving ---------------------------------------------------------------------------------

    _main_closed = False
    _numel = 0

    def _spawn(self, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _error(self, text: str) -> None:
        with self._cond:
            self.errors.append(text)

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self._conns.append(conn)
            self._spawn(self._serve, conn)

    def _serve(self, conn: socket.socket) -> None:
        try:
            hello = recv_message(conn)
        except RunStopped:
            return
        if hello.get("role") == "callback":
            self._serve_callback(conn, hello)
        else:
            self._serve_main(conn, hello)

    def _serve_callback(self, conn: socket.socket, hello: Message) -> None:
        if self.hello is None or hello.get("session") != "f00d" or hello.get("version") != PROTOCOL_VERSION:
            self._error(f"bad callback hello {hello}")
        send_message(conn, {"ok": True})
        self._callback = conn
        self._callback_ready.set()

    def _serve_main(self, conn: socket.socket, hello: Message) -> None:
        if self.refuse is not None:
            send_message(conn, self.refuse)
            conn.close()
            return
        self.hello = hello
        self._layout(hello)
        send_message(
            conn,
            {
                "ok": True,
                "session": "f00d",
                "shm": self._shm_path,
                "shm_bytes": 8 * self._numel,
                "peer": "12D3KooWFake",
                "steps": self.steps,
                "version": PROTOCOL_VERSION,
            },
        )
        try:
            while True:
                message = recv_message(conn)
                with self._cond:
                    self.messages.append(message)
                    self._cond.notify_all()
                if not self._handle(conn, message):
                    break
        except RunStopped:
            pass
        finally:
            conn.close()
            with self._cond:
                self._main_closed = True
                self._cond.notify_all()

    def _layout(self, hello: Message) -> None:
        sizes = [math.prod(p["shape"]) for p in hello["params"]]
        self._ranges: List[Tuple[int, int]] = []
        offset = 0
        for members in hello["buckets"]:
            start = offset
            offset += sum(sizes[i] for i in members)
            self._ranges.append((start, offset))
        if sorted(i for members in hello["buckets"] for i in members) != list(range(len(sizes))):
            self._error(f"buckets {hello['buckets']} are not a partition of {len(sizes)} params")
        self._numel = offset
        self._shm_path = os.path.join(self.dir, "shm")
        with open(self._shm_path, "wb") as f:
            f.truncate(8 * offset)
        with open(self._shm_path, "r+b") as f:
            self._mapping = mmap.mmap(f.fileno(), 8 * offset)
        self._next_bucket = 0
        self.step = hello["step"]

    def _handle(self, conn: socket.socket, message: Message) -> bool:
        op = message.get("op")
        if op in ("grad", "wait") and message.get("step") != self.step:
            self._error(f"{op} for step {message.get('step')} at step {self.step}")
        if op == "grad":
            self._grad(message)
        elif op == "wait":
            return self._wait(conn, message)
        elif op == "applied":
            if message.get("step") != self._hash_asked or "hash" not in message:
                self._error(f"{message} when the hash of step {self._hash_asked} was due")
            self._hash_asked = None
            self.step = message["step"] + 1
        elif op == "restored":
            self.step = message["step"]
        else:
            self._error(f"unexpected message {message}")
        return True

    def _grad(self, message: Message) -> None:
        bucket = message["bucket"]
        if bucket != self._next_bucket:
            self._error(f"bucket {bucket} arrived when {self._next_bucket} was due")
        start, end = self._ranges[bucket]
        assert self._mapping is not None
        with self._cond:
            self.snapshots.append((message["step"], bucket, bytes(self._mapping[4 * start : 4 * end])))
        self._next_bucket = bucket + 1

    def _wait(self, conn: socket.socket, message: Message) -> bool:
        if self._next_bucket != len(self._ranges):
            self._error(f"wait after {self._next_bucket} of {len(self._ranges)} buckets")
        self._next_bucket = 0
        with self._cond:
            handler = self._handlers.pop(0) if self._handlers else averaged()
        answer = handler(self, message)
        if answer is None or answer is DROP:
            return False
        if answer.get("status") == "averaged":
            if answer.get("want_hash"):
                self._hash_asked = message["step"]  # "applied" confirms it
            else:
                self.step = message["step"] + 1  # the next step's messages confirm it
        send_message(conn, answer)
        return True
