"""PyTorch side of p2ptrain: average a model's gradients with the peers of a p2ptrain daemon.

::

    import p2ptrain.torch as p2p

    col = p2p.Collective(model, opt, settings={"lr": 0.05, "batch": 64})
    while not col.finished:
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()        # hooks hand each bucket to the daemon as soon as backward fills it
        col.step(loss)         # waits for the averaged gradients, then runs opt.step()

or, changing only the optimizer::

    opt = p2p.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model)
    while not opt.finished:
        ...; loss.backward(); opt.step()

The daemon is ``p2ptrain join --trainer external``; the protocol is described in docs/pytorch.md.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import warnings
import weakref
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Protocol, Tuple, Union

import torch

from . import DaemonNotRunning, P2PTrainError, ProtocolError, RunStopped, _state
from ._layout import Layout
from ._session import Session, StateAnswer
from ._wire import Message, Region, region_over, scratch_region, socket_path


__all__ = ["Collective", "DistributedOptimizer", "Stateful"]

Loss = Union[float, torch.Tensor, None]

# Collective._synced's value for a step that synchronize() saw answered without an average.
_SKIPPED: Message = {"status": "skipped"}


class Stateful(Protocol):
    """Anything with ``state_dict()`` and ``load_state_dict()``, such as an LR scheduler."""

    def state_dict(self) -> Dict[str, Any]:
        """The object's state."""
        ...  # pragma: no cover

    def load_state_dict(self, state_dict: Dict[str, Any]) -> Any:
        """Restore the object's state."""
        ...  # pragma: no cover


def _settings_strings(settings: Optional[Mapping[str, Any]], optimizer: torch.optim.Optimizer) -> Dict[str, str]:
    derived = {"optimizer": type(optimizer).__name__}
    derived.update({str(key): str(value) for key, value in (settings or {}).items()})
    return derived


def _loss_value(loss: Loss) -> Optional[float]:
    if loss is None:
        return None
    value = float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)
    return value if math.isfinite(value) else None  # strict JSON has no NaN: leave it out


def _write_file(path: str, *chunks: Any) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o600)
    with os.fdopen(fd, "wb") as f:
        for chunk in chunks:
            f.write(chunk)


def _read_file(path: str, nbytes: int) -> bytearray:
    data = bytearray(nbytes)
    with open(path, "rb") as f:
        got = f.readinto(data)
    if got != nbytes:
        raise ProtocolError(f"the state file {path} has {got} bytes, the daemon announced {nbytes}")
    return data


def _scheduler_attached(optimizer: Any) -> bool:
    """Whether an LR scheduler was built on ``optimizer`` (torch's schedulers count its steps)."""
    return hasattr(optimizer, "_step_count")


def _check_scheduler(scheduler: Any) -> None:
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        raise TypeError(
            "scheduler= takes a scheduler stepped once per optimizer step; ReduceLROnPlateau steps on "
            "a metric: pass it as extra_state= and call scheduler.step(metric) yourself when step() "
            "returns True, with a metric every replica computes alike"
        )
    for method in ("step", "state_dict", "load_state_dict"):
        if not callable(getattr(scheduler, method, None)):
            raise TypeError(f"scheduler= needs a {method}() method; {type(scheduler).__name__} has none")


def _grad_hook(collective: "weakref.ref[Collective]", index: int) -> Callable[..., None]:
    """A hook for a parameter's gradient accumulator that does not keep the collective alive."""

    def hook(*_: Any) -> None:
        target = collective()
        if target is not None:
            target._grad_ready(index)

    return hook


class Collective:
    """Averages a model's gradients with the peers of a p2ptrain daemon, one step at a time.

    The constructor lays out the model's parameters that require grad (float32 only; a
    ``TypeError`` names any other), in buckets formed like DistributedDataParallel's: reverse
    registration order, packed up to ``bucket_cap_mb``. It installs gradient hooks; the session
    with the daemon opens on the first backward pass, :meth:`step` or :meth:`connect`, so a
    :meth:`load_state_dict` in between sets the step and parameters announced to the daemon.

    Args:
        model: the model; its parameters that require grad are averaged.
        optimizer: the optimizer that :meth:`step` runs on the averaged gradients.
        settings: training settings; peers whose settings differ do not train together. Values are
            sent as ``str(value)``; the key ``"optimizer"`` defaults to the optimizer's class name.
        socket: the daemon's socket (else ``$P2PTRAIN_SOCKET``, else the default for port 7420).
        bucket_cap_mb: the bucket size cap, in MiB.
        scheduler: an LR scheduler (``torch.optim.lr_scheduler``, built on ``optimizer``) that
            :meth:`step` steps after every applied update, and only then, so that its learning rate
            follows the cluster's step count; its state travels with the model's. Do not call its
            ``step()`` yourself: the next update raises :class:`~p2ptrain.P2PTrainError` if it moved.
        extra_state: an object with ``state_dict()``/``load_state_dict()`` whose state travels with
            the model's when a peer joins late or the cluster restores.
        timeout: seconds to wait for any one answer from the daemon (``None``: no limit); when it
            passes, the session ends with :class:`RunStopped`. A step the daemon retries after a
            peer died takes longer than usual, so keep it generous.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        settings: Optional[Mapping[str, Any]] = None,
        socket: Optional[Union[str, "os.PathLike[str]"]] = None,
        bucket_cap_mb: float = 25.0,
        scheduler: Optional[Any] = None,
        extra_state: Optional[Stateful] = None,
        timeout: Optional[float] = None,
    ) -> None:
        if scheduler is not None:
            _check_scheduler(scheduler)
        self._model = model
        self._optimizer = optimizer
        self._scheduler = scheduler
        self._scheduler_mark = self._scheduler_epoch()
        # A checkpoint's scheduler state loaded before the scheduler was set (see load_state_dict).
        self._pending_scheduler_state: Optional[Dict[str, Any]] = None
        self._warned_scheduler = False
        self._warned_loss = False
        self._wrapper: Optional[torch.optim.Optimizer] = None  # a DistributedOptimizer around optimizer
        self._extra = extra_state
        self._layout = Layout(model, bucket_cap_mb)
        self._settings = _settings_strings(settings, optimizer)
        self._socket_path = socket_path(socket)
        self._timeout = timeout
        # The optimizer update and a state or hash answer exclude each other; a callback that must
        # answer after an update in progress waits on it (see _await_update).
        self._lock = threading.Condition()
        self._session: Optional[Session] = None
        self._failure: Optional[BaseException] = None
        self._closed = False
        self._finished = False
        self._step = 0
        # After synchronize(): the averaged answer whose update step() applies next, or SKIPPED
        # when the step was answered otherwise (restored, finished); None before.
        self._synced: Optional[Message] = None
        self._syncing = True
        self._new_round()
        self._accumulators: List[Any] = []
        self._hooks: List[Any] = []
        self._install_hooks()

    # --- properties ------------------------------------------------------------------------------

    @property
    def completed_steps(self) -> int:
        """The number of steps the model's state has completed (the next step's number)."""
        return self._step

    @property
    def finished(self) -> bool:
        """Whether the run reached its length (the daemon's ``train.steps``)."""
        return self._finished

    @property
    def peer(self) -> str:
        """The daemon's peer ID. The session must be open: call :meth:`connect` first.

        Raises :class:`~p2ptrain.P2PTrainError` before the session opens (a ``None`` here once
        seeded every process's batches alike).
        """
        if self._session is None:
            raise P2PTrainError("the peer ID is known once the session is open: call connect() first")
        return self._session.welcome.peer

    @property
    def total_steps(self) -> Optional[int]:
        """The length of the run (the daemon's ``train.steps``), once the session is open."""
        return self._session.welcome.steps if self._session is not None else None

    @property
    def scheduler(self) -> Optional[Any]:
        """The LR scheduler :meth:`step` steps (the ``scheduler`` argument), or ``None``.

        Settable, for a scheduler that needs :attr:`total_steps` (known once the session is open):
        ``col.connect(); col.scheduler = CosineAnnealingLR(opt, T_max=col.total_steps)``. Set it
        before the first step, on every peer alike.
        """
        return self._scheduler

    @scheduler.setter
    def scheduler(self, scheduler: Optional[Any]) -> None:
        if scheduler is not None:
            _check_scheduler(scheduler)
        with self._lock:
            self._scheduler = scheduler
            if scheduler is not None and self._pending_scheduler_state is not None:
                scheduler.load_state_dict(self._pending_scheduler_state)
            self._pending_scheduler_state = None
            self._scheduler_mark = self._scheduler_epoch()

    @property
    def socket_path(self) -> str:
        """The daemon's socket this collective connects to."""
        return self._socket_path

    @property
    def buckets(self) -> List[List[str]]:
        """The parameter names of each bucket, bucket 0 first; their concatenation is the flat order."""
        return self._layout.bucket_names()

    # --- the session -----------------------------------------------------------------------------

    def connect(self) -> None:
        """Open the session with the daemon now, if it is not open (else the first backward does).

        Raises :class:`DaemonNotRunning` or :class:`LayoutMismatch` (the daemon refused).
        """
        self._check_usable()
        with self._ending_on_error():
            self._open_session()

    def _open_session(self) -> Session:
        if self._session is None:
            flat = scratch_region(self._layout.numel)
            with self._lock:
                step = self._step
                self._layout.write_params(flat.tensor)
            params, buckets = self._layout.describe()
            self._session = Session(
                self._socket_path,
                self._timeout,
                self,
                params=params,
                buckets=buckets,
                settings=self._settings,
                step=step,
                flat=flat,
            )
        return self._session

    def _check_usable(self) -> None:
        if self._closed:
            raise P2PTrainError("this Collective is closed")
        if self._failure is not None:
            raise self._failure

    @contextlib.contextmanager
    def _ending_on_error(self) -> Iterator[None]:
        """Any error inside ends the session: the exchange with the daemon is left half done.

        Only a daemon not running yet leaves the collective usable: nothing was exchanged, and a
        later backward, step or connect tries again.
        """
        try:
            yield
        except DaemonNotRunning:
            raise
        except BaseException as exc:
            self._failure = exc if isinstance(exc, P2PTrainError) else RunStopped(f"the session ended on {exc!r}")
            self._end_session()
            raise

    def _end_session(self) -> None:
        session = self._session
        if session is not None:
            self._session = None
            with self._lock:
                self._lock.notify_all()  # a callback waiting for an update stops waiting
            session.close()

    def close(self) -> None:
        """Remove the gradient hooks and close the session (which ends the daemon's run if unfinished)."""
        if self._closed:
            return
        self._closed = True
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        self._accumulators.clear()
        self._end_session()

    def __enter__(self) -> "Collective":
        """Use as a context manager: :meth:`close` on exit."""
        return self

    def __exit__(self, *exc_info: Any) -> None:
        """Close the collective."""
        self.close()

    # --- gradients -------------------------------------------------------------------------------

    def _install_hooks(self) -> None:
        # torch 1.13 has no post-accumulate-grad hook: hook each parameter's gradient accumulator
        # (Horovod's technique), and keep the accumulators alive so the hooks stay attached.
        me = weakref.ref(self)
        with torch.enable_grad():
            for index, p in enumerate(self._layout.params):
                accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
                self._accumulators.append(accumulator)
                self._hooks.append(accumulator.register_hook(_grad_hook(me, index)))

    def _new_round(self) -> None:
        self._ready = [False] * len(self._layout.params)
        self._missing = [len(members) for members in self._layout.buckets]
        self._next_bucket = 0

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside this block accumulate gradients without handing them over.

        To accumulate gradients over several backward passes, run all but the last inside it;
        the last one (outside) hands over the sum, as with DistributedDataParallel.no_sync().
        """
        previous, self._syncing = self._syncing, False
        try:
            yield
        finally:
            self._syncing = previous

    def _grad_ready(self, index: int) -> None:
        """Called by the hooks when backward has accumulated parameter ``index``'s gradient."""
        if not self._syncing or self._finished or self._closed or self._failure is not None:
            return
        with self._ending_on_error():
            if self._synced is _SKIPPED:
                self._synced = None  # synchronize() said False and the script went on without step()
            if self._synced is not None:
                raise P2PTrainError(
                    f"a backward pass between synchronize() and step() in step {self._step}: "
                    "call step() after synchronize() before the next backward"
                )
            bucket = self._layout.bucket_of[index]
            if bucket < self._next_bucket:
                raise P2PTrainError(
                    f"parameter {self._layout.names[index]!r} got a second gradient in step {self._step} after "
                    "its bucket was handed over: run all but the last of several backward passes inside "
                    "`with collective.no_sync():`"
                )
            if not self._ready[index]:
                self._ready[index] = True
                self._missing[bucket] -= 1
            self._send_buckets(complete_only=True)

    def _send_buckets(self, complete_only: bool) -> None:
        """Hand over buckets in index order: the complete ones, or all that are left."""
        session = self._open_session()
        buckets = len(self._layout.buckets)
        while self._next_bucket < buckets and not (complete_only and self._missing[self._next_bucket]):
            assert session.shm is not None
            self._layout.write_grads(self._next_bucket, session.shm.grads.tensor)
            session.grad(self._step, self._next_bucket)
            self._next_bucket += 1

    # --- the step --------------------------------------------------------------------------------

    def synchronize(self, loss: Loss = None) -> bool:
        """Finish this step's exchange: hand over what is left, wait, and put the average in ``p.grad``.

        Call it between ``backward()`` and :meth:`step` to work on the averaged gradients first, as
        gradient clipping must (``clip_grad_norm_`` before it would clip the local gradients, which
        the averages then replace)::

            loss.backward()
            if col.synchronize(loss):
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            col.step()

        Returns ``True`` when the averaged gradients are in ``p.grad`` (:meth:`step` then applies
        them), ``False`` when the step was answered otherwise (the cluster restored another state
        or the run finished; :meth:`step` then returns ``False``, and may be left out: the next
        backward starts the next step). ``loss`` is reported to the daemon, as :meth:`step`'s is;
        a ``step(loss)`` after it warns that its loss went nowhere. A second call before
        :meth:`step` returns the first one's answer. Raises what :meth:`step` raises.
        """
        self._check_usable()
        if self._synced is not None:
            return self._synced is not _SKIPPED
        if self._finished:
            return False
        self._warn_unstepped_scheduler()
        with self._ending_on_error():
            self._send_buckets(complete_only=False)
            assert self._session is not None and self._session.shm is not None
            answer = self._session.wait(self._step, _loss_value(loss))
            self._new_round()
            if answer["status"] == "averaged":
                self._layout.read_grads(self._session.shm.grads.tensor)
                self._synced = answer
                return True
            self._synced = _SKIPPED
            if answer["status"] == "restore":
                self._restore(answer)
            else:
                self._finished = True
            return False

    def step(self, loss: Loss = None) -> bool:
        """Finish this step with the peers: hand over what is left, wait, and act on the answer.

        Returns ``True`` when the averaged gradient was applied (``optimizer.step()`` ran on it, in
        ``p.grad``, then the ``scheduler``'s step), ``False`` when it was not: the cluster restored
        another state (loaded into the model, optimizer, ``scheduler`` and ``extra_state``; this
        step's gradients are dropped) or the run finished (:attr:`finished` is then true).
        ``loss`` (a float or a scalar tensor) is only reported to the daemon. After
        :meth:`synchronize`, it applies (or skips) what that call received.

        Raises :class:`LayoutMismatch` when the daemon stopped the run over differing settings and
        :class:`RunStopped` when it stopped it otherwise or a connection was lost.
        """
        if self._synced is None:
            if not self.synchronize(loss):
                self._synced = None
                return False
        elif loss is not None and not self._warned_loss:
            self._warned_loss = True
            warnings.warn(
                "step(loss) after synchronize(): the loss travels with synchronize()'s wait, so the "
                "daemon did not get this one; pass it to synchronize(loss) instead",
                stacklevel=2,
            )
        self._check_usable()
        answer, self._synced = self._synced, None
        if answer is _SKIPPED:
            return False
        assert answer is not None
        with self._ending_on_error():
            return self._apply(answer)

    def _scheduler_epoch(self) -> Any:
        return getattr(self._scheduler, "last_epoch", None)

    def _warn_unstepped_scheduler(self) -> None:
        """Warn once when an LR scheduler is built on the optimizer but not passed as ``scheduler=``."""
        if self._warned_scheduler or self._scheduler is not None or self._extra is not None:
            return
        if _scheduler_attached(self._optimizer) or (self._wrapper is not None and _scheduler_attached(self._wrapper)):
            self._warned_scheduler = True
            warnings.warn(
                "an LR scheduler is built on this optimizer but not passed as scheduler=: stepped "
                "by the script, its learning rate does not follow the steps the cluster restores "
                "or skips, and the replicas fork (pass scheduler=sched and drop sched.step())",
                stacklevel=4,
            )

    def _apply(self, answer: Message) -> bool:
        session = self._session
        assert session is not None and session.shm is not None
        step = self._step
        if self._scheduler is not None and self._scheduler_epoch() != self._scheduler_mark:
            raise P2PTrainError(
                f"the LR scheduler moved from epoch {self._scheduler_mark} to {self._scheduler_epoch()} "
                "outside the Collective: with scheduler= it is stepped after each applied update; "
                "remove the script's scheduler.step()"
            )
        with self._lock:
            self._optimizer.step()
            if self._scheduler is not None:
                self._scheduler.step()
                self._scheduler_mark = self._scheduler_epoch()
            self._step = step + 1
            self._lock.notify_all()
            digest = self._layout.param_hash(session.shm.params) if answer["want_hash"] else None
        if digest is not None:  # else the next step's first message confirms the update
            session.applied(step, digest)
        return True

    def _restore(self, answer: Message) -> bool:
        session = self._session
        assert session is not None and session.shm is not None
        params_bytes, extra_bytes = answer["params_bytes"], answer["extra_bytes"]
        if params_bytes != 4 * self._layout.numel:
            raise ProtocolError(f"a restore of {params_bytes} parameter bytes for {self._layout.numel} parameters")
        data = _read_file(answer["path"], params_bytes + extra_bytes)
        extra = _state.unpack(memoryview(data)[params_bytes:]) if extra_bytes else None
        with self._lock:
            self._layout.read_params(region_over(memoryview(data)[:params_bytes]).tensor)
            if extra is not None:
                self._load_extra(extra)
            self._step = answer["step"]
            self._layout.drop_grads()
            digest = self._layout.param_hash(session.shm.params)
        session.restored(self._step, digest)
        return False

    # --- state -----------------------------------------------------------------------------------

    def _buffers(self) -> Dict[str, torch.Tensor]:
        names = {name for name, _ in self._model.named_buffers()}
        return {key: value for key, value in self._model.state_dict().items() if key in names}

    def _extra_state(self) -> Dict[str, Any]:
        """Everything but the averaged parameters: what another peer needs to continue from here."""
        return {
            "step": self._step,
            "optimizer": self._optimizer.state_dict(),
            "extra": self._extra.state_dict() if self._extra is not None else None,
            "scheduler": self._scheduler.state_dict() if self._scheduler is not None else None,
            "buffers": self._buffers(),
        }

    def _load_extra(self, extra: Any) -> None:
        if not isinstance(extra, dict) or not isinstance(extra.get("optimizer"), dict):
            raise ProtocolError("the extra state holds no optimizer state")
        self._optimizer.load_state_dict(extra["optimizer"])
        if self._extra is not None and extra.get("extra") is not None:
            self._extra.load_state_dict(extra["extra"])
        if self._scheduler is not None and extra.get("scheduler") is not None:
            self._scheduler.load_state_dict(extra["scheduler"])
            self._scheduler_mark = self._scheduler_epoch()
        if extra.get("buffers"):
            self._model.load_state_dict(extra["buffers"], strict=False)

    def _await_update(self, after: int) -> None:
        """With the lock held: wait until the update the daemon announced is done.

        ``after`` is the step count an ``averaged`` answer, not yet confirmed, told this process to
        reach (0: none). While the state is one step short of it, the main thread has that answer
        (or is about to read it) and applies it next; nothing else is waited for, and nothing once
        the session has ended.
        """
        while after == self._step + 1 and self._session is not None and self._failure is None:
            self._lock.wait(1.0)

    def write_state(self, step: int, path: str, scratch: Region, after: int = 0) -> StateAnswer:
        """Callback: write the state at ``step`` to ``path`` (flat parameters, then extra state).

        Runs on the callback thread; part of the :class:`~p2ptrain._session.StateProvider` protocol.
        """
        with self._lock:
            self._await_update(after)
            if step != self._step:
                return StateAnswer(self._step)
            try:
                extra = _state.pack(self._extra_state())
                self._layout.write_params(scratch.tensor)
                _write_file(path, scratch.raw, extra)
            except Exception as exc:  # reported to the daemon, which logs it
                return StateAnswer(self._step, error=f"cannot write the state: {exc}")
            return StateAnswer(step, (len(scratch.raw), len(extra)))

    def current_hash(self, scratch: Region, after: int = 0) -> Tuple[int, str]:
        """Callback: the current step and parameter hash. Runs on the callback thread."""
        with self._lock:
            self._await_update(after)
            return self._step, self._layout.param_hash(scratch)

    def state_dict(self) -> Dict[str, Any]:
        """A checkpoint of the model, optimizer, step and ``extra_state``, for ``torch.save``."""
        with self._lock:
            return {
                "model": self._model.state_dict(),
                "optimizer": self._optimizer.state_dict(),
                "step": self._step,
                "extra": self._extra.state_dict() if self._extra is not None else None,
                "scheduler": self._scheduler.state_dict() if self._scheduler is not None else None,
            }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load a checkpoint made by :meth:`state_dict`; only before the session opens.

        The daemon is then told this step and these parameters in ``hello``.
        """
        if self._session is not None or self._failure is not None:
            raise P2PTrainError("load_state_dict must come before the session opens (the first backward or step)")
        with self._lock:
            self._model.load_state_dict(state_dict["model"])
            self._optimizer.load_state_dict(state_dict["optimizer"])
            if self._extra is not None and state_dict.get("extra") is not None:
                self._extra.load_state_dict(state_dict["extra"])
            if state_dict.get("scheduler") is not None:
                if self._scheduler is not None:
                    self._scheduler.load_state_dict(state_dict["scheduler"])
                    self._scheduler_mark = self._scheduler_epoch()
                else:  # set later (col.scheduler = ..., once total_steps is known): loaded then
                    self._pending_scheduler_state = dict(state_dict["scheduler"])
            self._step = int(state_dict["step"])


class DistributedOptimizer(torch.optim.Optimizer):
    """An optimizer whose :meth:`step` averages the gradients with the peers first.

    Wraps ``optimizer`` and a :class:`Collective` over ``model`` (``kwargs`` go to the
    Collective), so that ``loss.backward(); opt.step()`` is the whole change to a training loop.
    Everything else (``zero_grad``, ``param_groups``, ``state_dict``, ...) is the wrapped
    optimizer's. It is an ``Optimizer`` instance, so LR schedulers accept it.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module, **kwargs: Any) -> None:
        # Optimizer.__init__ is not called: the state lives in the wrapped optimizer.
        self.optimizer = optimizer
        self.collective = Collective(model, optimizer, **kwargs)
        self.collective._wrapper = self

    @property  # type: ignore[override]
    def param_groups(self) -> List[Dict[str, Any]]:
        """The wrapped optimizer's parameter groups."""
        return self.optimizer.param_groups

    @property  # type: ignore[override]
    def state(self) -> Any:
        """The wrapped optimizer's per-parameter state."""
        return self.optimizer.state

    @property  # type: ignore[override]
    def defaults(self) -> Dict[str, Any]:
        """The wrapped optimizer's defaults."""
        return self.optimizer.defaults

    @property
    def finished(self) -> bool:
        """Whether the run reached its length."""
        return self.collective.finished

    def synchronize(self, loss: Loss = None) -> bool:
        """Wait for the averaged gradients and put them in ``p.grad`` before :meth:`step`.

        For gradient clipping: ``loss.backward(); opt.synchronize(loss); clip_grad_norm_(...);
        opt.step()``. See :meth:`Collective.synchronize`.
        """
        return self.collective.synchronize(loss)

    def no_sync(self) -> "contextlib.AbstractContextManager[None]":
        """Accumulate gradients over backward passes inside it; see :meth:`Collective.no_sync`."""
        return self.collective.no_sync()

    def step(self, closure: Optional[Callable[[], Any]] = None, *, loss: Loss = None) -> Any:
        """Average the gradients with the peers and, unless the cluster restored or finished, apply them.

        ``closure`` (optional) runs once first, like any optimizer's; its result is returned and,
        without ``loss``, reported to the daemon. Whether the update was applied is
        ``self.collective.step``'s answer; see :meth:`Collective.step`.
        """
        result = None
        if closure is not None:
            with torch.enable_grad():
                result = closure()
        self.collective.step(loss if loss is not None else result)
        return result

    def zero_grad(self, set_to_none: Optional[bool] = None) -> None:
        """The wrapped optimizer's ``zero_grad`` (with its default for ``set_to_none``)."""
        if set_to_none is None:
            self.optimizer.zero_grad()
        else:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> Dict[str, Any]:
        """The wrapped optimizer's ``state_dict``."""
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """The wrapped optimizer's ``load_state_dict``."""
        self.optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """The wrapped optimizer's ``add_param_group`` (the new parameters are not averaged)."""
        self.optimizer.add_param_group(param_group)

    def close(self) -> None:
        """Close the collective."""
        self.collective.close()

    def __repr__(self) -> str:
        """``DistributedOptimizer(<the wrapped optimizer>)``."""
        return f"DistributedOptimizer({self.optimizer!r})"
