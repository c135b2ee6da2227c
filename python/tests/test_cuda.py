"""The Collective with its model on a CUDA GPU, against the fake daemon.

These tests run where torch sees a CUDA GPU and skip elsewhere, saying why; with
``P2PTRAIN_REQUIRE_GPU=1`` a missing GPU fails them instead (``scripts/gpu-check.sh`` sets it).
The gradients reach the daemon through host memory and the averages come back to the GPU; the
reference is the same model on the same GPU stepping on the halved gradients the fake daemon returns.
"""

from __future__ import annotations

import os
import unittest

import torch

from p2ptrain._wire import scratch_region
from p2ptrain.torch import Collective

from .fake_daemon import averaged, fixed
from .test_collective import DaemonTest, Net, assert_same_params, flat_hash, flat_values, float32_bytes, halve_grads

REQUIRED = os.environ.get("P2PTRAIN_REQUIRE_GPU") == "1"


def cuda_backward(model: torch.nn.Module, seed: int = 0) -> torch.Tensor:
    """One forward and backward pass of a model on the GPU, on seeded data; the loss."""
    torch.manual_seed(100 + seed)
    loss = model(torch.randn(5, 4).cuda()).pow(2).mean()
    loss.backward()
    return loss


@unittest.skipUnless(torch.cuda.is_available() or REQUIRED, "torch sees no CUDA GPU (GPU-only test)")
class CudaCollectiveTest(DaemonTest):
    def test_gradients_reach_the_daemon_from_the_gpu(self) -> None:
        model = Net().cuda()
        col = self.collective(model, torch.optim.SGD(model.parameters(), lr=0.1))
        cuda_backward(model)
        self.daemon.expect("grad", 6)
        self.assertEqual(b"".join(s[2] for s in self.daemon.snapshots), float32_bytes(flat_values(model, self.hello, grads=True)))
        self.assertTrue(col.step())

    def test_a_step_applies_exactly_the_daemons_average_on_the_gpu(self) -> None:
        model, reference = Net().cuda(), Net().cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
        col = self.collective(model, opt, bucket_cap_mb=25.0)
        for step in range(3):
            opt.zero_grad()
            self.assertTrue(col.step(cuda_backward(model, step)))
            ref_opt.zero_grad()
            cuda_backward(reference, step)
            halve_grads(reference)
            ref_opt.step()
            assert_same_params(self, model, reference)
        self.assertTrue(all(p.is_cuda for p in model.parameters()))

    def test_hash_of_a_gpu_model(self) -> None:
        model = Net().cuda()
        col = self.collective(model, torch.optim.SGD(model.parameters(), lr=0.1))
        self.daemon.answer(averaged(want_hash=True))
        cuda_backward(model)
        self.assertTrue(col.step())
        (applied,) = self.daemon.expect("applied")
        self.assertEqual(applied["hash"], flat_hash(model, self.hello))

    def test_state_of_a_gpu_model_restores_onto_a_gpu_model(self) -> None:
        donor = Net(seed=7).cuda()
        donor_opt = torch.optim.SGD(donor.parameters(), lr=0.1, momentum=0.9)
        cuda_backward(donor)
        donor_opt.step()
        donor_col = Collective(donor, donor_opt, socket=self.daemon.path)
        donor_col.load_state_dict({**donor_col.state_dict(), "step": 3})
        path = os.path.join(self.daemon.dir, "state")
        written = donor_col.write_state(3, path, scratch_region(donor_col._layout.numel))
        assert written.sizes is not None
        params_bytes, extra_bytes = written.sizes

        model = Net().cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        col = self.collective(model, opt)
        self.daemon.answer(fixed({"status": "restore", "step": 3, "path": path,
                                  "params_bytes": params_bytes, "extra_bytes": extra_bytes}))
        cuda_backward(model)
        self.assertFalse(col.step())
        assert_same_params(self, model, donor)
        for p, q in zip(model.parameters(), donor.parameters()):
            buf = opt.state[p]["momentum_buffer"]
            self.assertTrue(buf.is_cuda)
            self.assertTrue(torch.equal(buf, donor_opt.state[q]["momentum_buffer"]))
        (restored,) = self.daemon.expect("restored")
        self.assertEqual(restored["hash"], flat_hash(donor, self.hello))


if __name__ == "__main__":
    unittest.main()
