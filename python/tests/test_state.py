"""The pickle-free extra-state container."""

from __future__ import annotations

import math
import unittest
from typing import Any

import torch

from p2ptrain import ProtocolError
from p2ptrain._state import pack, unpack


def _adam_state() -> Any:
    torch.manual_seed(1)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.9, 0.99))
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(4, 3)).sum().backward()
        opt.step()
    return opt.state_dict()


class StateTest(unittest.TestCase):
    def assertSameTree(self, got: Any, want: Any) -> None:
        if isinstance(want, torch.Tensor):
            self.assertIsInstance(got, torch.Tensor)
            self.assertEqual(got.dtype, want.dtype)
            self.assertTrue(torch.equal(got, want))
        elif isinstance(want, dict):
            self.assertIsInstance(got, dict)
            self.assertEqual(list(got), list(want))
            for key in want:
                self.assertSameTree(got[key], want[key])
        elif isinstance(want, (list, tuple)):
            self.assertIs(type(got), type(want))
            self.assertEqual(len(got), len(want))
            for g, w in zip(got, want):
                self.assertSameTree(g, w)
        elif isinstance(want, float) and math.isnan(want):
            self.assertTrue(math.isnan(got))
        else:
            self.assertEqual(type(got), type(want))
            self.assertEqual(got, want)

    def test_optimizer_state_round_trips(self) -> None:
        state = _adam_state()
        got = unpack(pack(state))
        self.assertSameTree(got, state)
        torch.optim.Adam(torch.nn.Linear(3, 2).parameters()).load_state_dict(got)

    def test_scalars_containers_and_dtypes(self) -> None:
        value = {
            1: (None, True, 7, 2.5, "s", math.inf, -math.inf, math.nan),
            "tensors": [
                torch.arange(6, dtype=torch.int64).reshape(2, 3),
                torch.tensor(3.0),
                torch.zeros(0, 4),
                torch.tensor([True, False]),
                torch.tensor([1.5], dtype=torch.float16),
                torch.tensor([1.5], dtype=torch.bfloat16),
                torch.arange(4.0)[::2],
            ],
            (1, 2): [],
        }
        self.assertSameTree(unpack(pack(value)), value)

    def test_unsupported_values_are_named(self) -> None:
        with self.assertRaises(TypeError) as caught:
            pack({"sched": {"fn": len}})
        self.assertIn("state['sched']['fn']", str(caught.exception))

    def test_malformed_data_is_a_protocol_error(self) -> None:
        good = pack({"t": torch.ones(4)})
        bad = [b"", b"pickle!" + good, good[:20], good[:-1], good[:8] + b"\xff" * 8 + good[16:]]
        for data in bad:
            with self.subTest(data=data[:24]):
                with self.assertRaises(ProtocolError):
                    unpack(data)


if __name__ == "__main__":
    unittest.main()
