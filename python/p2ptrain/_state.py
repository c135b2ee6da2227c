"""The extra state: a pickle-free container for optimizer state, the step and user extras.

The extra bytes of a state file travel from one peer's process to another's, so they are decoded
without pickle (``torch.load`` runs arbitrary code, and torch 1.13's ``weights_only`` loader cannot
read a float). The container holds a tree of dicts, lists, tuples, ``None``, bools, ints, floats,
strings and tensors::

    b"P2PXTRA1" | u64 LE header length | header (JSON) | tensor bytes

The header is ``{"tree": <node>, "tensors": [{"dtype", "shape", "offset", "nbytes"}, ...]}``; a
node is a JSON scalar (a finite float, int, string, bool or null), or one of ``{"float": "nan" |
"inf" | "-inf"}``, ``{"dict": [[key, value], ...]}``, ``{"list": [...]}``, ``{"tuple": [...]}``,
``{"tensor": index}``. Tensors are stored contiguous, on the CPU, in native (little-endian) order.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any, Dict, List

import torch

from . import ProtocolError

__all__ = ["pack", "unpack"]

_MAGIC = b"P2PXTRA1"
_HEADER_LENGTH = struct.Struct("<Q")

_DTYPES: Dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_DTYPE_NAMES = {dtype: name for name, dtype in _DTYPES.items()}
_SPECIAL_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


# --- packing -----------------------------------------------------------------------------------


class _Packer:
    def __init__(self) -> None:
        self.tensors: List[Dict[str, Any]] = []
        self.blobs: List[bytes] = []
        self.size = 0

    def node(self, value: Any, path: str) -> Any:
        if value is None or isinstance(value, (bool, int, str)):
            return value
        if isinstance(value, float):
            return value if math.isfinite(value) else {"float": repr(value)}
        if isinstance(value, torch.Tensor):
            return {"tensor": self.tensor(value, path)}
        if isinstance(value, dict):
            return {"dict": [[self.node(k, f"{path}[{k!r}]"), self.node(v, f"{path}[{k!r}]")] for k, v in value.items()]}
        if isinstance(value, (list, tuple)):
            kind = "tuple" if isinstance(value, tuple) else "list"
            return {kind: [self.node(v, f"{path}[{i}]") for i, v in enumerate(value)]}
        raise TypeError(
            f"cannot store {path} (a {type(value).__name__}) in p2ptrain's state: only dicts, lists, "
            "tuples, tensors, numbers, strings, bools and None are stored"
        )

    def tensor(self, value: torch.Tensor, path: str) -> int:
        if value.dtype not in _DTYPE_NAMES or value.is_sparse:
            raise TypeError(f"cannot store {path}: tensors of {value.dtype} (layout {value.layout}) are not stored")
        flat = value.detach().to("cpu").contiguous().reshape(-1)
        raw = bytearray(flat.numel() * flat.element_size())
        if raw:
            torch.frombuffer(raw, dtype=flat.dtype).copy_(flat)
        self.tensors.append(
            {"dtype": _DTYPE_NAMES[value.dtype], "shape": list(value.shape), "offset": self.size, "nbytes": len(raw)}
        )
        self.blobs.append(bytes(raw))
        self.size += len(raw)
        return len(self.tensors) - 1


def pack(value: Any) -> bytes:
    """Encode ``value`` (a tree of containers, scalars and tensors) into the container format.

    Raises ``TypeError`` naming the first part of ``value`` that cannot be stored.
    """
    packer = _Packer()
    tree = packer.node(value, "state")
    header = json.dumps({"tree": tree, "tensors": packer.tensors}, allow_nan=False, separators=(",", ":"))
    encoded = header.encode("utf-8")
    return b"".join([_MAGIC, _HEADER_LENGTH.pack(len(encoded)), encoded, *packer.blobs])


# --- unpacking ---------------------------------------------------------------------------------


def _malformed(why: str) -> ProtocolError:
    return ProtocolError(f"malformed extra state: {why}")


class _Unpacker:
    def __init__(self, tensors: Any, blob: bytearray) -> None:
        if not isinstance(tensors, list):
            raise _malformed("tensors is not a list")
        self.specs = tensors
        self.blob = blob

    def node(self, node: Any) -> Any:
        if node is None or isinstance(node, (bool, int, str, float)):
            return node
        if not isinstance(node, dict) or len(node) != 1:
            raise _malformed(f"unexpected node {str(node)[:80]}")
        ((kind, body),) = node.items()
        if kind == "float" and body in _SPECIAL_FLOATS:
            return _SPECIAL_FLOATS[body]
        if kind == "tensor" and isinstance(body, int) and not isinstance(body, bool):
            return self.tensor(body)
        if kind in ("list", "tuple", "dict") and isinstance(body, list):
            return self.container(kind, body)
        raise _malformed(f"unexpected node {str(node)[:80]}")

    def container(self, kind: str, body: List[Any]) -> Any:
        if kind == "list":
            return [self.node(v) for v in body]
        if kind == "tuple":
            return tuple(self.node(v) for v in body)
        if not all(isinstance(pair, list) and len(pair) == 2 for pair in body):
            raise _malformed("a dict entry is not a [key, value] pair")
        try:
            return {self.node(k): self.node(v) for k, v in body}
        except TypeError:  # an unhashable key
            raise _malformed("a dict key is not hashable") from None

    def tensor(self, index: int) -> torch.Tensor:
        if not 0 <= index < len(self.specs) or not isinstance(self.specs[index], dict):
            raise _malformed(f"no tensor {index}")
        spec = self.specs[index]
        dtype = _DTYPES.get(spec.get("dtype"))
        shape, offset, nbytes = spec.get("shape"), spec.get("offset"), spec.get("nbytes")
        if dtype is None or not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise _malformed(f"tensor {index} has a bad dtype or shape")
        count = math.prod(shape)
        itemsize = torch.empty((), dtype=dtype).element_size()
        if not isinstance(offset, int) or nbytes != count * itemsize or offset < 0 or offset + nbytes > len(self.blob):
            raise _malformed(f"tensor {index} lies outside the data")
        if count == 0:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(self.blob, dtype=dtype, count=count, offset=offset).clone().reshape(shape)


def unpack(data: bytes) -> Any:
    """Decode what :func:`pack` encoded; anything else raises :class:`ProtocolError`."""
    start = len(_MAGIC) + _HEADER_LENGTH.size
    if len(data) < start or data[: len(_MAGIC)] != _MAGIC:
        raise _malformed("it does not start with the p2ptrain extra-state magic")
    (length,) = _HEADER_LENGTH.unpack_from(data, len(_MAGIC))
    if length > len(data) - start:
        raise _malformed("the header runs past the end")
    try:
        header = json.loads(bytes(data[start : start + length]).decode("utf-8"))
        if not isinstance(header, dict):
            raise _malformed("the header is not an object")
        blob = bytearray(data[start + length :])
        return _Unpacker(header.get("tensors"), blob).node(header.get("tree"))
    except (UnicodeDecodeError, ValueError) as exc:  # ProtocolError is no ValueError
        raise _malformed(f"bad header: {exc}") from None
    except RecursionError:
        raise _malformed("nested too deeply") from None
