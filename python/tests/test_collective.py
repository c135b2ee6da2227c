"""Collective and DistributedOptimizer against a fake daemon."""

from __future__ import annotations

import hashlib
import os
import struct
import threading
import unittest
import warnings
from typing import Any, List, Optional

import torch

from p2ptrain import DaemonNotRunning, LayoutMismatch, P2PTrainError, ProtocolError, RunStopped
from p2ptrain._state import unpack
from p2ptrain._wire import scratch_region
from p2ptrain.torch import Collective, DistributedOptimizer

from .fake_daemon import DROP, TIMEOUT, FakeDaemon, Message, averaged, fixed

TINY_CAP_MB = 1e-9  # one parameter per bucket


class Net(torch.nn.Module):
    """Layers registered a, b, c but run a → c → b, so backward completes b's buckets first."""

    seen: torch.Tensor

    def __init__(self, seed: int = 0, unused: bool = False) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.a = torch.nn.Linear(4, 6)
        self.b = torch.nn.Linear(6, 3)
        self.c = torch.nn.Linear(6, 6)
        self.unused = torch.nn.Linear(2, 2) if unused else None
        self.register_buffer("seen", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen += 1
        return self.b(torch.tanh(self.c(torch.tanh(self.a(x)))))


def backward(model: torch.nn.Module, seed: int = 0) -> torch.Tensor:
    """One forward and backward pass on seeded data; the loss."""
    torch.manual_seed(100 + seed)
    loss = model(torch.randn(5, 4)).pow(2).mean()
    loss.backward()
    return loss


def grad_of(p: torch.Tensor) -> torch.Tensor:
    """``p.grad``, which must be there."""
    assert p.grad is not None
    return p.grad


def halve_grads(model: torch.nn.Module) -> None:
    """Do to ``model``'s gradients what the fake daemon does to the process's."""
    for p in model.parameters():
        grad_of(p).mul_(0.5)


def flat_values(model: torch.nn.Module, hello: Message, grads: bool = False) -> List[float]:
    """The parameters (or gradients) in the flat order that ``hello`` announced."""
    named = dict(model.named_parameters())
    names = [p["name"] for p in hello["params"]]
    values: List[float] = []
    for bucket in hello["buckets"]:
        for index in bucket:
            p = named[names[index]]
            values.extend((grad_of(p) if grads else p).detach().reshape(-1).tolist())
    return values


def float32_bytes(values: List[float]) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def flat_hash(model: torch.nn.Module, hello: Message) -> str:
    """The parameter hash, computed independently of the package."""
    return hashlib.sha256(float32_bytes(flat_values(model, hello))).hexdigest()


def assert_same_params(test: unittest.TestCase, a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        test.assertTrue(torch.equal(p, q), name)


class DaemonTest(unittest.TestCase):
    """Each test gets a fresh fake daemon; it must have seen no protocol violation."""

    def setUp(self) -> None:
        self.daemon = FakeDaemon()
        self.addCleanup(self.daemon.close)

    def tearDown(self) -> None:
        self.assertEqual(self.daemon.errors, [])

    def collective(self, model: torch.nn.Module, opt: torch.optim.Optimizer, **kwargs: Any) -> Collective:
        kwargs.setdefault("bucket_cap_mb", TINY_CAP_MB)
        col = Collective(model, opt, socket=self.daemon.path, **kwargs)
        self.addCleanup(col.close)
        return col

    @property
    def hello(self) -> Message:
        assert self.daemon.hello is not None
        return self.daemon.hello


class ConnectingTest(DaemonTest):
    def test_daemon_not_running(self) -> None:
        path = os.path.join(self.daemon.dir, "elsewhere.sock")
        model = Net()
        col = Collective(model, torch.optim.SGD(model.parameters(), lr=0.1), socket=path)
        self.addCleanup(col.close)
        with self.assertRaises(DaemonNotRunning) as caught:
            backward(model)  # the first backward opens the session
        self.assertIn(path, str(caught.exception))
        self.assertIn("p2ptrain join --trainer external", str(caught.exception))
        # nothing was exchanged: once the daemon is there, the collective connects
        os.symlink(self.daemon.path, path)
        col.connect()
        self.assertEqual(col.peer, "12D3KooWFake")

    def test_hello(self) -> None:
        model = Net()
        col = self.collective(model, torch.optim.SGD(model.parameters(), lr=0.1), settings={"lr": 0.1, "batch": 64})
        col.connect()
        hello = self.hello
        self.assertEqual((hello["op"], hello["version"], hello["role"], hello["pid"]), ("hello", 2, "main", os.getpid()))
        self.assertEqual(hello["settings"], {"optimizer": "SGD", "lr": "0.1", "batch": "64"})
        self.assertEqual(hello["step"], 0)
        self.assertEqual(hello["params"][0], {"name": "a.weight", "shape": [6, 4], "dtype": "float32"})
        self.assertEqual(hello["buckets"], [[5], [4], [3], [2], [1], [0]])
        self.assertEqual(hello["hash"], flat_hash(model, hello))
        # the parameter region holds the parameters of the hash sent last, hello's included
        self.assertEqual(self.daemon.param_region(), float32_bytes(flat_values(model, hello)))
        self.assertEqual((col.peer, col.total_steps), ("12D3KooWFake", 100))
        self.assertEqual(col.buckets[0], ["c.bias"])

    def test_peer_is_refused_before_the_session_opens(self) -> None:
        model = Net()
        col = self.collective(model, torch.optim.SGD(model.parameters(), lr=0.1))
        with self.assertRaises(P2PTrainError) as caught:
            col.peer
        self.assertIn("connect()", str(caught.exception))
        col.connect()
        self.assertEqual(col.peer, "12D3KooWFake")

    def test_refused_hello(self) -> None:
        for kind in ("layout", "version", "busy"):
            with self.subTest(kind=kind):
                self.daemon.refuse = {"ok": False, "kind": kind, "error": "params differ: a.weight"}
                model = Net()
                col = self.collective(model, torch.optim.SGD(model.parameters(), lr=0.1))
                with self.assertRaises(LayoutMismatch) as caught:
                    col.connect()
                self.assertIn("params differ: a.weight", str(caught.exception))
                with self.assertRaises(LayoutMismatch):
                    col.step()  # the session is over

    def test_float16_parameter_refused(self) -> None:
        model = Net()
        model.c.half()
        with self.assertRaises(TypeError) as caught:
            Collective(model, torch.optim.SGD(model.parameters(), lr=0.1), socket=self.daemon.path)
        self.assertIn("c.weight", str(caught.exception))

    def test_load_state_dict_sets_the_step_announced(self) -> None:
        donor = Net(seed=3)
        donor_opt = torch.optim.SGD(donor.parameters(), lr=0.1, momentum=0.9)
        checkpoint = Collective(donor, donor_opt, socket=self.daemon.path).state_dict()
        checkpoint["step"] = 5
        model = Net()
        col = self.collective(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
        col.load_state_dict(checkpoint)
        col.connect()
        self.assertEqual(self.hello["step"], 5)
        self.assertEqual(self.hello["hash"], flat_hash(donor, self.hello))
        self.assertEqual(col.completed_steps, 5)
        with self.assertRaises(P2PTrainError):
            col.load_state_dict(checkpoint)

    def test_close_ends_the_session_and_removes_hooks(self) -> None:
        model = Net()
        with self.collective(model, torch.optim.SGD(model.parameters(), lr=0.1)) as col:
            col.connect()
        self.daemon.wait_closed()
        backward(model)  # no hook left to hand anything over
        self.assertEqual(self.daemon.ops("grad"), [])
        with self.assertRaises(P2PTrainError):
            col.step()


class StepTest(DaemonTest):
    def test_grads_are_handed_over_during_backward_in_index_order(self) -> None:
        model = Net()
        col = self.collective(model, torch.optim.SGD(model.parameters(), lr=0.1))
        backward(model)
        # every bucket arrived before step(): b's buckets (2, 3) completed first and were held
        self.daemon.expect("grad", 6)
        self.assertEqual([m["bucket"] for m in self.daemon.ops("grad")], [0, 1, 2, 3, 4, 5])
        self.assertEqual(b"".join(s[2] for s in self.daemon.snapshots), float32_bytes(flat_values(model, self.hello, grads=True)))
        self.assertTrue(col.step())

    def test_a_step_applies_exactly_the_daemons_average(self) -> None:
        model, reference = Net(), Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
        col = self.collective(model, opt, bucket_cap_mb=25.0)
        for step in range(3):
            opt.zero_grad()
            loss = backward(model, step)
            self.assertTrue(col.step(loss))
            ref_opt.zero_grad()
            backward(reference, step)
            halve_grads(reference)
            ref_opt.step()
            assert_same_params(self, model, reference)
        self.assertEqual(col.completed_steps, 3)
        waits = self.daemon.expect("wait", 3)
        self.assertAlmostEqual(waits[0]["loss"], backward(Net(), 0).item(), places=6)
        self.assertEqual([m["step"] for m in waits], [0, 1, 2])
        # no hash was asked for: each step's messages confirmed the update before it
        self.assertEqual(self.daemon.ops("applied"), [])

    def test_applied_carries_the_hash_when_asked(self) -> None:
        model = Net()
        col = self.collective(model, torch.optim.SGD(model.parameters(), lr=0.1))
        self.daemon.answer(averaged(want_hash=True))
        backward(model)
        self.assertTrue(col.step())
        (applied,) = self.daemon.expect("applied")
        self.assertEqual(applied["hash"], flat_hash(model, self.hello))
        self.assertEqual(self.daemon.param_region(), float32_bytes(flat_values(model, self.hello)))

    def test_unused_parameters_are_handed_over_as_zeros(self) -> None:
        model = Net(unused=True)
        col = self.collective(model, torch.optim.SGD(model.parameters(), lr=0.1))
        backward(model)
        self.assertTrue(col.step())
        # buckets 0 and 1 are unused.bias and unused.weight: they held back every other bucket
        snapshots = self.daemon.snapshots
        self.assertEqual([s[1] for s in snapshots], list(range(8)))
        self.assertEqual(snapshots[0][2] + snapshots[1][2], bytes(4 * 6))
        assert model.unused is not None
        self.assertTrue(torch.equal(grad_of(model.unused.weight), torch.zeros(2, 2)))

    def test_no_sync_accumulates_and_hands_over_the_sum(self) -> None:
        model, reference = Net(), Net()
        col = self.collective(model, torch.optim.SGD(model.parameters(), lr=0.1))
        with col.no_sync():
            backward(model, 0)
        backward(model, 1)
        self.assertTrue(col.step())
        backward(reference, 0)
        backward(reference, 1)
        self.assertEqual(len(self.daemon.snapshots), 6)
        self.assertEqual(
            b"".join(s[2] for s in self.daemon.snapshots), float32_bytes(flat_values(reference, self.hello, grads=True))
        )

    def test_a_second_backward_without_no_sync_is_refused(self) -> None:
        model = Net()
        col = self.collective(model, torch.optim.SGD(model.parameters(), lr=0.1))
        backward(model, 0)
        with self.assertRaises(P2PTrainError) as caught:
            backward(model, 1)
        self.assertIn("no_sync", str(caught.exception))
        with self.assertRaises(P2PTrainError):
            col.step()

    def test_restore_loads_the_state_and_skips_the_step(self) -> None:
        donor = Net(seed=7)
        donor_opt = torch.optim.SGD(donor.parameters(), lr=0.1, momentum=0.9)
        donor_sched = torch.optim.lr_scheduler.StepLR(donor_opt, step_size=1, gamma=0.5)
        backward(donor)
        donor_opt.step()
        donor_sched.step()
        donor_col = Collective(donor, donor_opt, socket=self.daemon.path, extra_state=donor_sched)
        donor_col.load_state_dict({**donor_col.state_dict(), "step": 7})
        path = os.path.join(self.daemon.dir, "state")
        written = donor_col.write_state(7, path, scratch_region(donor_col._layout.numel))
        assert written.sizes is not None
        params_bytes, extra_bytes = written.sizes

        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        col = self.collective(model, opt, extra_state=sched)
        restore = {"status": "restore", "step": 7, "path": path, "params_bytes": params_bytes, "extra_bytes": extra_bytes}
        self.daemon.answer(fixed(restore))
        backward(model)
        self.assertFalse(col.step())
        assert_same_params(self, model, donor)
        self.assertEqual(col.completed_steps, 7)
        self.assertTrue(all(p.grad is None for p in model.parameters()))
        for p, q in zip(model.parameters(), donor.parameters()):
            self.assertTrue(torch.equal(opt.state[p]["momentum_buffer"], donor_opt.state[q]["momentum_buffer"]))
        self.assertEqual(sched.last_epoch, 1)
        self.assertEqual(opt.param_groups[0]["lr"], 0.05)
        self.assertTrue(torch.equal(model.seen, donor.seen))
        (restored,) = self.daemon.expect("restored")
        self.assertEqual(restored, {"op": "restored", "step": 7, "hash": flat_hash(donor, self.hello)})
        self.assertEqual(self.daemon.param_region(), float32_bytes(flat_values(donor, self.hello)))
        # the next step is 7
        backward(model)
        self.assertTrue(col.step())
        self.assertEqual(self.daemon.expect("wait", 2)[1]["step"], 7)

    def donor_state(self, lr_steps: int) -> dict:
        """A restore answer for step 7 from a donor whose StepLR has stepped ``lr_steps`` times."""
        donor = Net(seed=7)
        donor_opt = torch.optim.SGD(donor.parameters(), lr=0.1)
        donor_sched = torch.optim.lr_scheduler.StepLR(donor_opt, step_size=1, gamma=0.5)
        for _ in range(lr_steps):
            donor_opt.step()
            donor_sched.step()
        donor_col = Collective(donor, donor_opt, socket=self.daemon.path, scheduler=donor_sched)
        self.addCleanup(donor_col.close)
        donor_col.load_state_dict({**donor_col.state_dict(), "step": 7})
        path = os.path.join(self.daemon.dir, "state")
        written = donor_col.write_state(7, path, scratch_region(donor_col._layout.numel))
        assert written.sizes is not None
        params_bytes, extra_bytes = written.sizes
        return {"status": "restore", "step": 7, "path": path, "params_bytes": params_bytes, "extra_bytes": extra_bytes}

    def test_the_scheduler_steps_after_each_applied_update_only(self) -> None:
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        col = self.collective(model, opt, scheduler=sched)
        restore = self.donor_state(lr_steps=3)
        self.daemon.answer(averaged(), fixed(restore), averaged())
        backward(model)
        self.assertTrue(col.step())
        self.assertEqual((sched.last_epoch, opt.param_groups[0]["lr"]), (1, 0.05))
        opt.zero_grad()
        backward(model)
        self.assertFalse(col.step())  # restored: the donor's scheduler, not stepped again
        self.assertEqual((sched.last_epoch, opt.param_groups[0]["lr"]), (3, 0.0125))
        backward(model)
        self.assertTrue(col.step())
        self.assertEqual((sched.last_epoch, opt.param_groups[0]["lr"]), (4, 0.00625))
        self.assertEqual(col.state_dict()["scheduler"]["last_epoch"], 4)

    def test_a_scheduler_stepped_outside_is_refused(self) -> None:
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        col = self.collective(model, opt, scheduler=sched)
        backward(model)
        self.assertTrue(col.step())
        sched.step()  # the script's own call, as before the conversion
        opt.zero_grad()
        backward(model)
        with self.assertRaises(P2PTrainError) as caught:
            col.step()
        self.assertIn("remove the script's scheduler.step()", str(caught.exception))

    def test_a_metric_scheduler_is_refused(self) -> None:
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with self.assertRaises(TypeError) as caught:
            Collective(model, opt, socket=self.daemon.path, scheduler=torch.optim.lr_scheduler.ReduceLROnPlateau(opt))
        self.assertIn("ReduceLROnPlateau", str(caught.exception))

    def test_a_scheduler_left_out_is_warned_about(self) -> None:
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        col = self.collective(model, opt)
        torch.optim.lr_scheduler.StepLR(opt, step_size=1)
        backward(model)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.assertTrue(col.step())
        self.assertEqual(len(caught), 1)
        self.assertIn("scheduler=", str(caught[0].message))

    def test_synchronize_puts_the_average_in_grad_before_step(self) -> None:
        model, reference = Net(), Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
        col = self.collective(model, opt)
        backward(model)
        self.assertTrue(col.synchronize())
        self.assertTrue(col.synchronize())  # a second call repeats the answer: one wait only
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
        self.assertTrue(col.step())
        backward(reference)
        halve_grads(reference)
        self.assertAlmostEqual(float(norm), float(torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.01)), places=6)
        ref_opt.step()
        assert_same_params(self, model, reference)
        self.assertEqual(len(self.daemon.expect("wait")), 1)
        self.assertEqual(col.completed_steps, 1)

    def test_synchronize_on_a_restore_makes_step_skip(self) -> None:
        model = Net()
        col = self.collective(model, torch.optim.SGD(model.parameters(), lr=0.1))
        self.daemon.answer(fixed(self.donor_state(lr_steps=0)))
        backward(model)
        self.assertFalse(col.synchronize())
        self.assertFalse(col.step())
        self.assertEqual(col.completed_steps, 7)
        backward(model)  # the next step goes on as usual
        self.assertTrue(col.step())
        self.assertEqual([m["step"] for m in self.daemon.expect("wait", 2)], [0, 7])

    def test_a_skipped_step_may_be_left_out(self) -> None:
        model = Net()
        col = self.collective(model, torch.optim.SGD(model.parameters(), lr=0.1))
        self.daemon.answer(fixed(self.donor_state(lr_steps=0)))
        backward(model)
        self.assertFalse(col.synchronize())
        backward(model, 1)  # no step(): the script went on to the next step
        self.assertTrue(col.step())
        self.assertEqual([m["step"] for m in self.daemon.expect("wait", 2)], [0, 7])

    def test_the_loss_goes_with_synchronize(self) -> None:
        model = Net()
        col = self.collective(model, torch.optim.SGD(model.parameters(), lr=0.1))
        backward(model)
        self.assertTrue(col.synchronize(0.25))
        self.assertTrue(col.step())
        backward(model, 1)
        self.assertTrue(col.synchronize())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.assertTrue(col.step(0.5))  # too late: the wait went out with synchronize()
        self.assertEqual(len(caught), 1)
        self.assertIn("pass it to synchronize(loss)", str(caught[0].message))
        self.assertEqual([m.get("loss") for m in self.daemon.expect("wait", 2)], [0.25, None])

    def test_a_checkpoints_scheduler_waits_for_the_scheduler(self) -> None:
        donor = Net()
        donor_opt = torch.optim.SGD(donor.parameters(), lr=0.1)
        donor_sched = torch.optim.lr_scheduler.StepLR(donor_opt, step_size=1, gamma=0.5)
        for _ in range(3):
            donor_opt.step()
            donor_sched.step()
        checkpoint = Collective(donor, donor_opt, socket=self.daemon.path, scheduler=donor_sched).state_dict()
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        col = self.collective(model, opt)
        col.load_state_dict(checkpoint)  # before the scheduler exists: it needs total_steps
        col.connect()
        col.scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        self.assertEqual((col.scheduler.last_epoch, opt.param_groups[0]["lr"]), (3, 0.0125))
        backward(model)
        self.assertTrue(col.step())
        self.assertEqual(col.scheduler.last_epoch, 4)

    def test_a_backward_between_synchronize_and_step_is_refused(self) -> None:
        model = Net()
        col = self.collective(model, torch.optim.SGD(model.parameters(), lr=0.1))
        backward(model)
        self.assertTrue(col.synchronize())
        with self.assertRaises(P2PTrainError) as caught:
            backward(model, 1)
        self.assertIn("between synchronize() and step()", str(caught.exception))

    def test_finished(self) -> None:
        model = Net()
        col = self.collective(model, torch.optim.SGD(model.parameters(), lr=0.1))
        self.daemon.answer(fixed({"status": "finished", "step": 0}))
        backward(model)
        self.assertFalse(col.finished)
        self.assertFalse(col.step())
        self.assertTrue(col.finished)
        backward(model)
        self.assertFalse(col.step())
        self.assertEqual(len(self.daemon.ops("grad")), 6)

    def test_stopped(self) -> None:
        model = Net()
        col = self.collective(model, torch.optim.SGD(model.parameters(), lr=0.1))
        self.daemon.answer(fixed({"status": "stopped", "kind": "error", "error": "3 non-finite averages"}))
        backward(model)
        with self.assertRaises(RunStopped) as caught:
            col.step()
        self.assertIn("3 non-finite averages", str(caught.exception))
        with self.assertRaises(RunStopped):
            col.step()

    def test_stopped_over_settings_is_a_layout_mismatch(self) -> None:
        model = Net()
        col = self.collective(model, torch.optim.SGD(model.parameters(), lr=0.1))
        self.daemon.answer(fixed({"status": "stopped", "kind": "settings", "error": "settings differ: lr"}))
        backward(model)
        with self.assertRaises(LayoutMismatch) as caught:
            col.step()
        self.assertIn("settings differ: lr", str(caught.exception))

    def test_connection_lost_mid_wait(self) -> None:
        model = Net()
        col = self.collective(model, torch.optim.SGD(model.parameters(), lr=0.1))
        self.daemon.answer(fixed(DROP))
        backward(model)
        with self.assertRaises(RunStopped):
            col.step()

    def test_no_answer_within_the_timeout(self) -> None:
        release = threading.Event()
        self.addCleanup(release.set)

        def hold(daemon: FakeDaemon, wait: Message) -> Optional[Message]:
            release.wait(TIMEOUT)
            return None

        model = Net()
        col = self.collective(model, torch.optim.SGD(model.parameters(), lr=0.1), timeout=0.05)
        self.daemon.answer(hold)
        backward(model)
        with self.assertRaises(RunStopped) as caught:
            col.step()
        self.assertIn("no answer", str(caught.exception))

    def test_a_malformed_answer_is_a_protocol_error(self) -> None:
        model = Net()
        col = self.collective(model, torch.optim.SGD(model.parameters(), lr=0.1))
        self.daemon.answer(fixed({"status": "averaged", "step": 99}))
        backward(model)
        with self.assertRaises(ProtocolError):
            col.step()


class CallbackTest(DaemonTest):
    def setUp(self) -> None:
        super().setUp()
        self.model = Net()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.col = self.collective(self.model, self.opt)
        backward(self.model)
        self.assertTrue(self.col.step())  # step 1, with a momentum buffer

    def test_state_answer(self) -> None:
        path = os.path.join(self.daemon.dir, "state")
        answer = self.daemon.request({"op": "state", "step": 1, "path": path})
        assert answer is not None
        params_bytes = 4 * len(flat_values(self.model, self.hello))
        self.assertEqual(answer, {"ok": True, "step": 1, "params_bytes": params_bytes, "extra_bytes": answer["extra_bytes"]})
        with open(path, "rb") as f:
            data = f.read()
        self.assertEqual(os.stat(path).st_mode & 0o777, 0o600)
        self.assertEqual(len(data), params_bytes + answer["extra_bytes"])
        self.assertEqual(data[:params_bytes], float32_bytes(flat_values(self.model, self.hello)))
        extra = unpack(data[params_bytes:])
        self.assertEqual(extra["step"], 1)
        self.assertEqual(len(extra["optimizer"]["state"]), 6)
        self.assertTrue(torch.equal(extra["buffers"]["seen"], torch.tensor(1.0)))

    def test_state_at_another_step(self) -> None:
        answer = self.daemon.request({"op": "state", "step": 4, "path": os.path.join(self.daemon.dir, "x")})
        self.assertEqual(answer, {"ok": False, "step": 1, "error": "at step 1"})

    def test_hash_answer(self) -> None:
        answer = self.daemon.request({"op": "hash"})
        self.assertEqual(answer, {"ok": True, "step": 1, "hash": flat_hash(self.model, self.hello)})
        self.assertEqual(self.daemon.param_region(), float32_bytes(flat_values(self.model, self.hello)))
        # an update already done, or one the process was never told about, is not waited for
        for after in (1, 3):
            self.assertEqual(self.daemon.request({"op": "hash", "after": after})["step"], 1)  # type: ignore[index]

    def test_an_unknown_request_ends_the_session(self) -> None:
        self.assertIsNone(self.daemon.request({"op": "bogus"}))
        self.daemon.wait_closed()
        with self.assertRaises(RunStopped) as caught:
            backward(self.model)  # the hooks meet the closed main connection
        self.assertIn("bogus", str(caught.exception))
        with self.assertRaises(RunStopped):
            self.col.step()


class BlockingSGD(torch.optim.SGD):
    """SGD whose step waits for ``proceed`` after setting ``entered``."""

    def __init__(self, params: Any, lr: float) -> None:
        super().__init__(params, lr=lr)
        self.entered = threading.Event()
        self.proceed = threading.Event()

    def step(self, closure: Any = None) -> Any:
        self.entered.set()
        assert self.proceed.wait(TIMEOUT)
        return super().step(closure)


class SpyLock:
    """A condition that notes when the callback thread asks for it, and when it waits on it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.callback_waits = threading.Event()
        self.callback_awaits_update = threading.Event()

    def __enter__(self) -> None:
        if threading.current_thread().name == "p2ptrain-callback":
            self.callback_waits.set()
        self._cond.acquire()

    def __exit__(self, *exc_info: Any) -> None:
        self._cond.release()

    def wait(self, timeout: Optional[float] = None) -> bool:
        if threading.current_thread().name == "p2ptrain-callback":
            self.callback_awaits_update.set()
        return self._cond.wait(timeout)

    def notify_all(self) -> None:
        self._cond.notify_all()


class ExclusionTest(DaemonTest):
    def test_a_state_request_waits_for_the_update_in_progress(self) -> None:
        model = Net()
        opt = BlockingSGD(model.parameters(), lr=0.1)
        col = self.collective(model, opt)
        col._lock = lock = SpyLock()  # type: ignore[assignment]
        backward(model)
        results: List[Any] = []
        stepper = threading.Thread(target=lambda: results.append(col.step()))
        stepper.start()
        self.assertTrue(opt.entered.wait(TIMEOUT))  # the update holds the lock
        request = {"op": "state", "step": 0, "path": os.path.join(self.daemon.dir, "state")}
        asker = threading.Thread(target=lambda: results.append(self.daemon.request(request)))
        asker.start()
        self.assertTrue(lock.callback_waits.wait(TIMEOUT))
        opt.proceed.set()
        stepper.join(TIMEOUT)
        asker.join(TIMEOUT)
        self.assertCountEqual(results, [True, {"ok": False, "step": 1, "error": "at step 1"}])

    def test_a_request_after_an_unconfirmed_average_waits_for_its_update(self) -> None:
        # The daemon answered "averaged" (no hash asked) and asks for the hash before the process's
        # next message, with after=1; the main thread has the answer but has not taken the lock yet.
        model = Net()
        col = self.collective(model, torch.optim.SGD(model.parameters(), lr=0.1))
        col._lock = lock = SpyLock()  # type: ignore[assignment]
        reading, proceed = threading.Event(), threading.Event()
        read_grads = col._layout.read_grads

        def slow_read_grads(flat: torch.Tensor) -> None:
            reading.set()
            assert proceed.wait(TIMEOUT)
            read_grads(flat)

        col._layout.read_grads = slow_read_grads  # type: ignore[assignment]
        backward(model)
        results: List[Any] = []
        stepper = threading.Thread(target=lambda: results.append(col.step()))
        stepper.start()
        self.assertTrue(reading.wait(TIMEOUT))
        asker = threading.Thread(target=lambda: results.append(self.daemon.request({"op": "hash", "after": 1})))
        asker.start()
        self.assertTrue(lock.callback_awaits_update.wait(TIMEOUT))  # it waits rather than answer step 0
        proceed.set()
        stepper.join(TIMEOUT)
        asker.join(TIMEOUT)
        self.assertCountEqual(results, [True, {"ok": True, "step": 1, "hash": flat_hash(model, self.hello)}])


class DistributedOptimizerTest(DaemonTest):
    def test_step_averages_then_applies(self) -> None:
        model, reference = Net(), Net()
        inner = torch.optim.SGD(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.StepLR(inner, step_size=1, gamma=0.5)
        opt = DistributedOptimizer(inner, model, socket=self.daemon.path, scheduler=sched)
        self.addCleanup(opt.close)
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
        ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=1, gamma=0.5)
        for step in range(2):
            opt.zero_grad()
            backward(model, step)
            opt.step()  # steps sched too
            ref_opt.zero_grad()
            backward(reference, step)
            halve_grads(reference)
            ref_opt.step()
            ref_sched.step()
            assert_same_params(self, model, reference)
        self.assertEqual(opt.param_groups[0]["lr"], 0.025)
        self.assertEqual(opt.collective.completed_steps, 2)
        self.assertFalse(opt.finished)
        self.assertEqual(opt.state_dict()["param_groups"][0]["lr"], 0.025)
        self.assertIn("SGD", repr(opt))

    def test_a_scheduler_built_on_the_wrapper_is_warned_about(self) -> None:
        model = Net()
        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, socket=self.daemon.path)
        self.addCleanup(opt.close)
        torch.optim.lr_scheduler.StepLR(opt, step_size=1)  # it is an Optimizer, so this works
        backward(model)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            opt.step()
        self.assertEqual([str(w.message)[:24] for w in caught], ["an LR scheduler is built"])

    def test_synchronize_and_no_sync_are_the_collectives(self) -> None:
        model, reference = Net(), Net()
        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, socket=self.daemon.path)
        self.addCleanup(opt.close)
        with opt.no_sync():
            backward(model, 0)
        backward(model, 1)
        self.assertTrue(opt.synchronize())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
        opt.step()
        backward(reference, 0)
        backward(reference, 1)
        halve_grads(reference)
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.01)
        torch.optim.SGD(reference.parameters(), lr=0.1).step()
        assert_same_params(self, model, reference)

    def test_closure(self) -> None:
        model = Net()
        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, socket=self.daemon.path)
        self.addCleanup(opt.close)
        loss = opt.step(lambda: backward(model))
        (wait,) = self.daemon.expect("wait")
        self.assertAlmostEqual(wait["loss"], float(loss), places=6)


if __name__ == "__main__":
    unittest.main()
