"""The layout: which parameters the daemon averages, their buckets, and their flat order.

Buckets are formed like DistributedDataParallel's: the parameters in reverse registration order,
packed greedily up to a byte cap, so bucket 0 holds the last layers, which backward completes first.
The flat order is the concatenation of the buckets; every gradient, parameter vector and hash on the
wire uses it.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from ._wire import Region, sha256_hex

__all__ = ["assign_buckets", "Layout"]


def assign_buckets(sizes: Sequence[int], cap_bytes: int) -> List[List[int]]:
    """Bucket parameters of byte sizes ``sizes`` (registration order); returns lists of indices.

    Indices are taken in reverse order and packed greedily: a bucket is closed before a parameter
    that would take it over ``cap_bytes``, so only a parameter larger than the cap by itself makes a
    bucket larger than the cap.
    """
    buckets: List[List[int]] = []
    current: List[int] = []
    filled = 0
    for index in reversed(range(len(sizes))):
        if current and filled + sizes[index] > cap_bytes:
            buckets.append(current)
            current, filled = [], 0
        current.append(index)
        filled += sizes[index]
    if current:
        buckets.append(current)
    return buckets


class Layout:
    """The parameters of a model that the daemon averages, bucketed, with their flat offsets."""

    def __init__(self, model: torch.nn.Module, bucket_cap_mb: float) -> None:
        """Lay out ``model``'s parameters that require grad.

        Raises ``TypeError`` naming a parameter that is not float32, ``ValueError`` when no
        parameter requires grad or the cap is not positive.
        """
        if not bucket_cap_mb > 0:
            raise ValueError(f"bucket_cap_mb must be positive, not {bucket_cap_mb}")
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError("the model has no parameter that requires grad")
        for name, p in named:
            if p.dtype != torch.float32:
                raise TypeError(
                    f"parameter {name!r} is {p.dtype}: p2ptrain averages float32 parameters only "
                    "(train in float32, or freeze the parameter with requires_grad_(False))"
                )
        self.names: List[str] = [name for name, _ in named]
        self.params: List[torch.nn.Parameter] = [p for _, p in named]
        self.buckets: List[List[int]] = assign_buckets(
            [4 * p.numel() for p in self.params], int(bucket_cap_mb * 1024 * 1024)
        )
        self.bucket_of: List[int] = [0] * len(self.params)
        self.offsets: List[int] = [0] * len(self.params)
        self.bucket_ranges: List[Tuple[int, int]] = []
        offset = 0
        for b, members in enumerate(self.buckets):
            start = offset
            for index in members:
                self.bucket_of[index] = b
                self.offsets[index] = offset
                offset += self.params[index].numel()
            self.bucket_ranges.append((start, offset))
        self.numel: int = offset

    # --- description -------------------------------------------------------------------------

    def describe(self) -> Tuple[List[Dict[str, Any]], List[List[int]]]:
        """The ``params`` and ``buckets`` fields of ``hello``."""
        params = [
            {"name": name, "shape": list(p.shape), "dtype": "float32"} for name, p in zip(self.names, self.params)
        ]
        return params, [list(members) for members in self.buckets]

    def bucket_names(self) -> List[List[str]]:
        """Each bucket's parameter names, in flat order."""
        return [[self.names[i] for i in members] for members in self.buckets]

    # --- copies between the model and flat regions ----------------------------------------------

    def _views(self, flat: torch.Tensor, indices: Optional[Sequence[int]] = None) -> Iterator[Tuple[torch.nn.Parameter, torch.Tensor]]:
        """Each parameter with the view of ``flat`` that holds it, shaped like the parameter."""
        for index in range(len(self.params)) if indices is None else indices:
            p = self.params[index]
            start = self.offsets[index]
            yield p, flat[start : start + p.numel()].view(p.shape)

    def write_grads(self, bucket: int, flat: torch.Tensor) -> None:
        """Copy bucket ``bucket``'s gradients into ``flat`` (zeros for a parameter without one)."""
        for p, view in self._views(flat, self.buckets[bucket]):
            if p.grad is None:
                view.zero_()
            else:
                view.copy_(p.grad)

    def read_grads(self, flat: torch.Tensor) -> None:
        """Set every parameter's gradient to its part of ``flat`` (copied, never aliased)."""
        for p, view in self._views(flat):
            if p.grad is None:
                p.grad = torch.empty_like(p)
            p.grad.copy_(view)

    def drop_grads(self) -> None:
        """Forget every parameter's gradient."""
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def write_params(self, flat: torch.Tensor) -> None:
        """Copy the parameters into ``flat``, in flat order."""
        for p, view in self._views(flat):
            view.copy_(p)

    @torch.no_grad()
    def read_params(self, flat: torch.Tensor) -> None:
        """Set the parameters from ``flat``."""
        for p, view in self._views(flat):
            p.copy_(view)

    def param_hash(self, scratch: Region) -> str:
        """The parameter hash: SHA-256 of the flat float32 parameters, staged in ``scratch``."""
        self.write_params(scratch.tensor)
        return sha256_hex(scratch.raw)
