#!/usr/bin/env python3
"""Train your own PyTorch model on Fashion-MNIST, all-reducing through a p2ptrain daemon.

The model is defined here, not in p2ptrain: by default a small residual CNN (``--model resnet``:
a convolution stem, two residual blocks with GroupNorm, a strided convolution between them, global
average pooling and a linear head); ``--model mlp`` is the 784-hidden-hidden-10 MLP that the
benchmarks compare with p2ptrain's built-in trainer.

Start a daemon with ``p2ptrain join --trainer external --steps N ...`` on every machine, then this
script beside each one::

    PYTHONPATH=python python3 python/examples/fashion_mnist.py --socket /path/to/daemon.sock

The changes from a single-process PyTorch script are the three lines marked ``p2ptrain``. With
``--ddp RANK:WORLD:HOST:PORT`` the same model, data and batch train under PyTorch
DistributedDataParallel (gloo) instead: the baseline that ``bench/torch-bridge.sh`` compares with;
with ``--local`` alone, with a plain ``opt.step()``.

The last line printed is ``done step=S test_loss=L accuracy=A param_hash=H`` (H: the SHA-256 of the
float32 parameters in the daemon's flat order, the same hash the daemon prints).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import os
import struct
import sys
import time
from typing import Tuple

import torch
import torch.nn.functional as F

DATA_DIRS = ("/usr/share/datasets/fashion-mnist", "/usr/local/share/datasets/fashion-mnist")


def load_idx(path: str) -> torch.Tensor:
    """Reads a gzipped IDX file (images or labels) into a uint8 tensor."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    magic, = struct.unpack(">I", raw[:4])
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    return torch.frombuffer(bytearray(raw[4 + 4 * ndim:]), dtype=torch.uint8).reshape(dims)


def load_fashion_mnist(split: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """Returns (images as float32 in [0, 1], shape N×784; labels as int64) of "train" or "t10k"."""
    for d in [os.environ.get("P2PTRAIN_DATA", "")] + list(DATA_DIRS):
        img = os.path.join(d, f"{split}-images-idx3-ubyte.gz")
        if d and os.path.exists(img):
            x = load_idx(img).reshape(-1, 784).float() / 255.0
            y = load_idx(os.path.join(d, f"{split}-labels-idx1-ubyte.gz")).long()
            return x, y
    sys.exit("fashion_mnist.py: Fashion-MNIST not found; install it with `apt-get install dataset-fashion-mnist` "
             "(scripts/setup.sh does) or set P2PTRAIN_DATA")


class ResidualBlock(torch.nn.Module):
    """x + conv-norm-relu-conv-norm(x), then ReLU."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            torch.nn.GroupNorm(4, channels), torch.nn.ReLU(),
            torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            torch.nn.GroupNorm(4, channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x + self.body(x))


class SmallResNet(torch.nn.Module):
    """A ResNet-style CNN for 28x28 images: width channels at 28x28, 2x width at 14x14.

    GroupNorm, not BatchNorm: its statistics are per sample, so it keeps no running buffers that
    would differ between the replicas (only parameters are averaged).
    """

    def __init__(self, width: int) -> None:
        super().__init__()
        self.stem = torch.nn.Sequential(
            torch.nn.Conv2d(1, width, 3, padding=1, bias=False), torch.nn.GroupNorm(4, width), torch.nn.ReLU())
        self.stage1 = ResidualBlock(width)
        self.down = torch.nn.Sequential(
            torch.nn.Conv2d(width, 2 * width, 3, stride=2, padding=1, bias=False),
            torch.nn.GroupNorm(4, 2 * width), torch.nn.ReLU())
        self.stage2 = ResidualBlock(2 * width)
        self.head = torch.nn.Linear(2 * width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.view(-1, 1, 28, 28)
        x = self.stage2(self.down(self.stage1(self.stem(x))))
        return self.head(x.mean(dim=(2, 3)))


def make_model(name: str, hidden: int, width: int) -> torch.nn.Module:
    """The model named by --model."""
    if name == "resnet":
        return SmallResNet(width)
    return torch.nn.Sequential(
        torch.nn.Linear(784, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, 10))


def flat_hash(model: torch.nn.Module, order: list) -> str:
    """SHA-256 of the parameters as float32, in the given order of parameter names."""
    params = dict(model.named_parameters())
    h = hashlib.sha256()
    for name in order:
        h.update(params[name].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> Tuple[float, float]:
    """Mean cross-entropy and accuracy on (x, y)."""
    with torch.no_grad():
        logits = model(x)
        return F.cross_entropy(logits, y).item(), (logits.argmax(1) == y).float().mean().item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--socket", help="the daemon's socket (default: $P2PTRAIN_SOCKET or the daemon's default)")
    ap.add_argument("--steps", type=int, default=0, help="with --ddp: steps to train (the daemon's train.steps otherwise)")
    ap.add_argument("--batch", type=int, default=64, help="samples per process per step")
    ap.add_argument("--model", choices=("resnet", "mlp"), default="resnet",
                    help="resnet: a small residual CNN; mlp: 784-hidden-hidden-10 (what the benchmarks use)")
    ap.add_argument("--hidden", type=int, default=256, help="mlp: hidden width")
    ap.add_argument("--width", type=int, default=8, help="resnet: channels of the first stage (a multiple of 4)")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--schedule", choices=("constant", "cosine"), default="constant",
                    help="learning rate: constant, or cosine annealing to 0 over the run")
    ap.add_argument("--clip-norm", type=float, default=0.0, help="clip the averaged gradient to this norm (0: no clipping)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--init-seed", type=int, help="seed of the initial parameters (default --seed; not a "
                    "cluster setting: at step 0 every peer starts from the coordinator's parameters)")
    ap.add_argument("--train-samples", type=int, default=0, help="use the first N training samples (0: all)")
    ap.add_argument("--eval-samples", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--device", default="cpu", help="where the model trains: cpu, cuda or cuda:N (the daemon gets "
                    "the gradients in host memory either way)")
    ap.add_argument("--ddp", help="RANK:WORLD:HOST:PORT: train with DistributedDataParallel (gloo) instead")
    ap.add_argument("--ddp-fp16", action="store_true", help="with --ddp: fp16 compression hook")
    ap.add_argument("--local", action="store_true", help="train alone with a plain opt.step() for --steps steps "
                    "(the compute the bridge adds to: scripts/bridge-overhead.sh)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    try:
        device = torch.device(args.device)
    except RuntimeError as e:
        ap.error(f"--device {args.device}: {e}")
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: torch {torch.__version__} sees no CUDA GPU")

    x, y = load_fashion_mnist("train")
    if args.train_samples:
        x, y = x[:args.train_samples], y[:args.train_samples]
    tx, ty = load_fashion_mnist("t10k")
    tx, ty = tx[:args.eval_samples], ty[:args.eval_samples]
    x, y, tx, ty = x.to(device), y.to(device), tx.to(device), ty.to(device)

    torch.manual_seed(args.seed if args.init_seed is None else args.init_seed)
    if args.width <= 0 or args.width % 4:
        ap.error(f"--width {args.width}: want a positive multiple of 4 (GroupNorm uses 4 groups)")
    model = make_model(args.model, args.hidden, args.width).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    shape = f"mlp-{args.hidden}" if args.model == "mlp" else f"resnet-{args.width}"
    # The device type is part of the settings: a GPU and a CPU round the same update differently, so
    # a cluster that mixes them would fork; the daemons refuse the mix at join, naming it.
    settings = {"model": shape, "lr": args.lr, "batch": args.batch, "seed": args.seed,
                "train_samples": args.train_samples, "device": device.type,
                "schedule": args.schedule, "clip_norm": args.clip_norm}

    if args.ddp or args.local:
        run_baseline(args, model, opt, x, y, tx, ty)
        return

    import p2ptrain.torch as p2p                                                       # p2ptrain
    col = p2p.Collective(model, opt, settings=settings, socket=args.socket)           # p2ptrain
    col.connect()
    if args.schedule == "cosine":  # the length of the run is the daemon's train.steps           # p2ptrain
        col.scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=col.total_steps)  # p2ptrain
    # Each process draws its own batches: the peer ID seeds them.
    rng = torch.Generator().manual_seed(args.seed ^ int(hashlib.sha256(col.peer.encode()).hexdigest()[:8], 16))
    start, loss = time.monotonic(), float("nan")
    while not col.finished:
        idx = torch.randint(len(x), (args.batch,), generator=rng).to(device)
        opt.zero_grad()
        out = F.cross_entropy(model(x[idx]), y[idx])
        out.backward()
        report = out.item()  # the loss the daemon shows, sent with the wait for the averages
        if args.clip_norm:
            if col.synchronize(report):  # the averages are now in p.grad                   # p2ptrain
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_norm)
            report = None  # synchronize() sent it
        if col.step(report):                                                          # p2ptrain (was opt.step())
            loss = out.item()
            s = col.completed_steps
            if s % 50 == 0:
                print(f"step {s} loss {loss:.4f} {(time.monotonic() - start) / s * 1000:.1f} ms/step", flush=True)
    order = [n for bucket in col.buckets for n in bucket]
    test_loss, acc = evaluate(model, tx, ty)
    steps = col.completed_steps
    col.close()
    print(f"done step={steps} test_loss={test_loss:.4f} accuracy={acc:.4f} param_hash={flat_hash(model, order)}", flush=True)


def run_baseline(args: argparse.Namespace, model: torch.nn.Module, opt: torch.optim.Optimizer,
                 x: torch.Tensor, y: torch.Tensor, tx: torch.Tensor, ty: torch.Tensor) -> None:
    """The baselines: the same model, batch and optimizer under DistributedDataParallel (gloo), or
    alone (--local)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    ddp, rank = model, "0"
    if args.ddp:
        rank, world, host, port = args.ddp.split(":")
        dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=int(rank), world_size=int(world))
        ddp = DDP(model)
        if args.ddp_fp16:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    rng = torch.Generator().manual_seed(args.seed * 1000 + int(rank))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps) if args.schedule == "cosine" else None
    start = time.monotonic()
    for s in range(1, args.steps + 1):
        idx = torch.randint(len(x), (args.batch,), generator=rng).to(x.device)
        opt.zero_grad()
        out = F.cross_entropy(ddp(x[idx]), y[idx])
        out.backward()
        if args.clip_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_norm)
        opt.step()
        if sched is not None:
            sched.step()
        if s % 50 == 0:
            print(f"step {s} loss {out.item():.4f} {(time.monotonic() - start) / s * 1000:.1f} ms/step", flush=True)
    test_loss, acc = evaluate(model, tx, ty)
    if args.ddp:
        dist.destroy_process_group()
    print(f"done step={args.steps} test_loss={test_loss:.4f} accuracy={acc:.4f}", flush=True)


if __name__ == "__main__":
    main()
