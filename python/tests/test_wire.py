"""Framing, socket path resolution, connecting and shared memory."""

from __future__ import annotations

import gc
import json
import os
import pathlib
import socket
import struct
import tempfile
import threading
import unittest

import torch

from p2ptrain import DaemonNotRunning, ProtocolError, RunStopped
from p2ptrain._wire import (
    MAX_MESSAGE_BYTES,
    SharedMemory,
    connect,
    encode_message,
    recv_message,
    send_message,
    socket_path,
)


class FramingTest(unittest.TestCase):
    def setUp(self) -> None:
        self.a, self.b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.addCleanup(self.a.close)
        self.addCleanup(self.b.close)

    def test_encoding_is_length_then_compact_json(self) -> None:
        body = b'{"op":"grad","step":3,"bucket":1}'
        self.assertEqual(encode_message({"op": "grad", "step": 3, "bucket": 1}), struct.pack("<I", len(body)) + body)

    def test_round_trip(self) -> None:
        message = {"op": "hello", "params": [{"name": "fc.weight", "shape": [10, 64]}], "loss": 0.53, "é": "ü"}
        send_message(self.a, message)
        send_message(self.a, {"op": "wait", "step": 1})
        self.assertEqual(recv_message(self.b), message)
        self.assertEqual(recv_message(self.b), {"op": "wait", "step": 1})

    def test_oversize_messages_are_refused_both_ways(self) -> None:
        with self.assertRaises(ProtocolError):
            encode_message({"blob": "x" * MAX_MESSAGE_BYTES})
        self.a.sendall(struct.pack("<I", MAX_MESSAGE_BYTES + 1))
        with self.assertRaises(ProtocolError):
            recv_message(self.b)

    def test_a_message_of_the_largest_size_passes(self) -> None:
        body = json.dumps({"blob": "x" * (MAX_MESSAGE_BYTES - 12)}).encode()
        self.assertEqual(len(body), MAX_MESSAGE_BYTES)
        writer = threading.Thread(target=self.a.sendall, args=(struct.pack("<I", len(body)) + body,))
        writer.start()
        self.assertEqual(len(recv_message(self.b)["blob"]), MAX_MESSAGE_BYTES - 12)
        writer.join()

    def test_empty_message_is_refused(self) -> None:
        self.a.sendall(struct.pack("<I", 0))
        with self.assertRaises(ProtocolError):
            recv_message(self.b)

    def test_malformed_bodies_are_protocol_errors(self) -> None:
        for body in (b"{not json", b"[1, 2]", b"\xff\xfe{}", b'"a string"'):
            with self.subTest(body=body):
                self.a.sendall(struct.pack("<I", len(body)) + body)
                with self.assertRaises(ProtocolError):
                    recv_message(self.b)

    def test_non_finite_numbers_are_not_sent(self) -> None:
        with self.assertRaises(ValueError):
            encode_message({"loss": float("nan")})

    def test_closed_connection_is_run_stopped(self) -> None:
        self.a.sendall(struct.pack("<I", 10) + b'{"op"')
        self.a.close()
        with self.assertRaises(RunStopped):
            recv_message(self.b)
        with self.assertRaises(RunStopped):
            recv_message(self.b)


class SocketPathTest(unittest.TestCase):
    def test_argument_first(self) -> None:
        self.assertEqual(socket_path("/x/a.sock", {"P2PTRAIN_SOCKET": "/y", "XDG_RUNTIME_DIR": "/r"}), "/x/a.sock")

    def test_then_the_environment_variable(self) -> None:
        self.assertEqual(socket_path(None, {"P2PTRAIN_SOCKET": "/y/b.sock", "XDG_RUNTIME_DIR": "/r"}), "/y/b.sock")

    def test_then_xdg_runtime_dir(self) -> None:
        self.assertEqual(socket_path(None, {"XDG_RUNTIME_DIR": "/run/user/7"}), "/run/user/7/p2ptrain-7420.sock")

    def test_then_tmp_per_user(self) -> None:
        expected = f"/tmp/p2ptrain-{os.getuid()}/7420.sock"
        self.assertEqual(socket_path(None, {}), expected)
        self.assertEqual(socket_path(None, {"XDG_RUNTIME_DIR": "", "P2PTRAIN_SOCKET": ""}), expected)

    def test_path_like(self) -> None:
        self.assertEqual(socket_path(pathlib.Path("/x/c.sock"), {}), "/x/c.sock")


class ConnectTest(unittest.TestCase):
    def setUp(self) -> None:
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.dir = tmp.name

    def test_missing_socket(self) -> None:
        path = os.path.join(self.dir, "none.sock")
        with self.assertRaises(DaemonNotRunning) as caught:
            connect(path, None)
        self.assertIn(path, str(caught.exception))
        self.assertIn("p2ptrain join --trainer external", str(caught.exception))

    def test_refused_connection(self) -> None:
        path = os.path.join(self.dir, "stale.sock")
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stale.bind(path)  # a socket file that nobody listens on, as a dead daemon leaves it
        stale.close()
        with self.assertRaises(DaemonNotRunning) as caught:
            connect(path, None)
        self.assertIn(path, str(caught.exception))


class SharedMemoryTest(unittest.TestCase):
    def setUp(self) -> None:
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.path = os.path.join(tmp.name, "shm")
        with open(self.path, "wb") as f:
            f.truncate(8 * 3)

    def test_regions_are_the_two_halves_of_the_file(self) -> None:
        shm = SharedMemory(self.path, 24)
        shm.grads.tensor.copy_(torch.tensor([1.0, 2.0, 3.0]))
        shm.params.tensor.copy_(torch.tensor([-1.0, 0.5, 4.0]))
        with open(self.path, "rb") as f:
            self.assertEqual(f.read(), struct.pack("<6f", 1.0, 2.0, 3.0, -1.0, 0.5, 4.0))
        self.assertEqual(bytes(shm.params.raw), struct.pack("<3f", -1.0, 0.5, 4.0))
        shm.close()

    def test_a_view_outlives_close(self) -> None:
        shm = SharedMemory(self.path, 24)
        view = shm.grads.tensor
        shm.close()
        del shm
        gc.collect()
        view.fill_(7.0)  # still mapped: the view holds the mapping
        with open(self.path, "rb") as f:
            self.assertEqual(f.read(12), struct.pack("<3f", 7.0, 7.0, 7.0))

    def test_short_file_is_a_protocol_error(self) -> None:
        with self.assertRaises(ProtocolError):
            SharedMemory(self.path, 32)

    def test_missing_file_is_a_protocol_error(self) -> None:
        with self.assertRaises(ProtocolError):
            SharedMemory(self.path + ".gone", 24)


if __name__ == "__main__":
    unittest.main()
