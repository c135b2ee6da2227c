#!/usr/bin/env python3
"""PyTorch baseline for `p2ptrain bench train`: the same models, batch and step.

One step is forward, cross-entropy, backward and an SGD step (lr 0.05,
momentum 0.9) on random 28x28 images, in fp32 with TF32 off (p2ptrain's
cuBLAS GEMMs are plain fp32), on one device. Prints samples/s per model,
after --warmup untimed steps.

Not the same work: here the batch stays on the GPU and the optimizer runs
there. A p2ptrain step also gathers its batch on the host and copies it in,
copies the gradients out, runs the optimizer on the host (its master copy of
the parameters) and copies the parameters back to every device, as a peer
must to all-reduce between machines.

  python3 bench/torch_train.py --device cuda --batch 256 --steps 200
  p2ptrain bench train --devices cuda:0 --model mlp --batch-size 256 --steps 200
"""
import argparse
import json
import time

import torch
from torch import nn


def mlp():
    # p2ptrain's mlp: 784-1024-1024-10 with ReLU.
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 1024), nn.ReLU(),
                         nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))


def cnn():
    # p2ptrain's cnn: conv3x3(32)-relu-maxpool2, conv3x3(64)-relu-maxpool2,
    # dense 3136-128-relu, dense 128-10 (NCHW here, NHWC in p2ptrain).
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(7 * 7 * 64, 128), nn.ReLU(), nn.Linear(128, 10))


def bench(name, device, batch, warmup, steps):
    torch.manual_seed(1)
    model = {"mlp": mlp, "cnn": cnn}[name]().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(batch, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (batch,), device=device)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    for _ in range(warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        loss = step()
    loss.item()  # waits for the device
    elapsed = time.perf_counter() - start
    return {"device": str(device), "model": name, "batch": batch, "steps": steps,
            "samples_per_s": steps * batch / elapsed, "step_ms": elapsed / steps * 1e3}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--models", default="mlp,cnn")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device(a.device)
    rows = [bench(m, device, a.batch, a.warmup, a.steps) for m in a.models.split(",")]
    if a.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'DEVICE':8} {'MODEL':5} {'BATCH':>5} {'STEPS':>5} {'SAMPLES/S':>10} {'STEP':>10}")
    for r in rows:
        print(f"{r['device']:8} {r['model']:5} {r['batch']:5d} {r['steps']:5d} {r['samples_per_s']:10.0f} {r['step_ms']:7.2f} ms")


if __name__ == "__main__":
    main()
