"""Bucketing and the flat order."""

from __future__ import annotations

import unittest

import torch

from p2ptrain._layout import Layout, assign_buckets


class Net(torch.nn.Module):
    """Three layers registered a, b, c; 10·4+10, 10·10+10 and 2·10+2 float32 values."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(4, 10)
        self.b = torch.nn.Linear(10, 10)
        self.c = torch.nn.Linear(10, 2)


class AssignBucketsTest(unittest.TestCase):
    def test_reverse_order_packed_up_to_the_cap(self) -> None:
        self.assertEqual(assign_buckets([4, 8, 16, 4], 20), [[3, 2], [1, 0]])

    def test_a_parameter_over_the_cap_gets_a_bucket_of_its_own(self) -> None:
        self.assertEqual(assign_buckets([4, 100, 4], 8), [[2], [1], [0]])

    def test_everything_in_one_bucket_under_a_large_cap(self) -> None:
        self.assertEqual(assign_buckets([4, 4, 4], 1 << 20), [[2, 1, 0]])


class LayoutTest(unittest.TestCase):
    def test_buckets_follow_ddp(self) -> None:
        # a cap of 440 bytes = 110 floats: c (20+2) and b.bias (10) fit, b.weight (100) does not
        layout = Layout(Net(), 440 / (1024 * 1024))
        self.assertEqual(layout.names, ["a.weight", "a.bias", "b.weight", "b.bias", "c.weight", "c.bias"])
        self.assertEqual(layout.buckets, [[5, 4, 3], [2, 1], [0]])
        self.assertEqual(layout.bucket_names()[0], ["c.bias", "c.weight", "b.bias"])
        self.assertEqual(layout.bucket_ranges, [(0, 32), (32, 142), (142, 182)])
        self.assertEqual(layout.offsets, [142, 132, 32, 22, 2, 0])
        self.assertEqual(layout.numel, 182)

    def test_describe(self) -> None:
        params, buckets = Layout(Net(), 25.0).describe()
        self.assertEqual(params[0], {"name": "a.weight", "shape": [10, 4], "dtype": "float32"})
        self.assertEqual(buckets, [[5, 4, 3, 2, 1, 0]])

    def test_frozen_parameters_are_left_out(self) -> None:
        net = Net()
        net.a.requires_grad_(False)
        self.assertEqual(Layout(net, 25.0).names, ["b.weight", "b.bias", "c.weight", "c.bias"])

    def test_float16_is_refused_by_name(self) -> None:
        net = Net()
        net.b.half()
        with self.assertRaises(TypeError) as caught:
            Layout(net, 25.0)
        self.assertIn("b.weight", str(caught.exception))
        self.assertIn("float16", str(caught.exception))

    def test_no_trainable_parameter(self) -> None:
        with self.assertRaises(ValueError):
            Layout(Net().requires_grad_(False), 25.0)

    def test_params_round_trip_through_a_flat_vector(self) -> None:
        net = Net()
        layout = Layout(net, 440 / (1024 * 1024))
        flat = torch.empty(layout.numel)
        layout.write_params(flat)
        self.assertTrue(torch.equal(flat[0:2], net.c.bias.detach()))
        layout.read_params(flat * 2)
        self.assertTrue(torch.equal(net.c.bias.detach(), flat[0:2] * 2))


if __name__ == "__main__":
    unittest.main()
