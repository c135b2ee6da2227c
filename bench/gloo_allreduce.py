#!/usr/bin/env python3
"""One rank of PyTorch's gloo all-reduce benchmark: the baseline that
bench/netns.sh --gloo runs on the same test hosts as p2ptrain's
`bench allreduce`, measured the same way.

Every rank all-reduces (sums) an fp32 tensor of --size bytes: one untimed
warm-up round, then --rounds timed rounds, each after a barrier so that all
ranks start it together. The round times are averaged over the ranks (as
p2ptrain's cluster benchmark does), and the median is reported. The CPU time
(user + system, all threads, getrusage) this process used from the barrier
before the first timed round to one after the last, per GB (1e9 bytes) of
buffer all-reduced, is this rank's own figure; the whole machine's busy CPU
time over the same rounds (/proc/stat, every process and the kernel's
interrupt work) per GB is machine_cpu_s_per_gb (Linux only).

Prints one JSON object on stdout:
  {"impl": "gloo", "size_bytes", "peers", "median_s", "algbw_gbps",
   "busbw_gbps", "cpu_s_per_gb", "machine_cpu_s_per_gb"}
with busbw = algbw · 2(W−1)/W (the nccl-tests convention).

Usage (one per host; GLOO_SOCKET_IFNAME picks the interface):
  gloo_allreduce.py --rank R --world W --master 10.77.0.11:29500 \
      --size-bytes 67108864 --rounds 5
"""

import argparse
import json
import os
import resource
import statistics
import sys
import time


def cpu_seconds():
    """User + system CPU seconds of this process (all its threads)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def machine_cpu_seconds():
    """Busy CPU seconds of the whole machine since boot (every process and the
    kernel's interrupt work: /proc/stat's user, nice, system, irq and softirq,
    as p2ptrain's MachineCPU), or None where /proc/stat cannot be read."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        if len(fields) < 8 or fields[0] != "cpu":
            return None
        ticks = sum(int(fields[i]) for i in (1, 2, 3, 6, 7))
        return ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return None


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rank", type=int, required=True, help="this rank, 0..world-1")
    p.add_argument("--world", type=int, required=True, help="number of ranks")
    p.add_argument("--master", required=True, help="HOST:PORT of rank 0's rendezvous")
    p.add_argument("--size-bytes", type=int, default=64 << 20, help="fp32 buffer bytes")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds after one warm-up")
    p.add_argument("--timeout", type=float, default=300, help="seconds for the rendezvous and each collective")
    a = p.parse_args(argv)
    if a.world < 1 or not 0 <= a.rank < a.world:
        p.error(f"--rank {a.rank} is not in 0..{a.world - 1} (--world {a.world})")
    if a.size_bytes <= 0 or a.size_bytes % 4:
        p.error(f"--size-bytes must be a positive multiple of 4, got {a.size_bytes}")
    if a.rounds <= 0:
        p.error(f"--rounds must be positive, got {a.rounds}")
    host, sep, port = a.master.rpartition(":")
    if not sep or not host or not port.isdigit():
        p.error(f"--master wants HOST:PORT, got {a.master!r}")
    return a


def main(argv):
    a = parse_args(argv)
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{a.master}",
        rank=a.rank,
        world_size=a.world,
        timeout=datetime.timedelta(seconds=a.timeout),
    )
    try:
        gen = torch.Generator().manual_seed(a.rank)
        data = torch.randn(a.size_bytes // 4, generator=gen, dtype=torch.float32)
        times = []
        cpu0, machine0 = 0.0, None
        for r in range(-1, a.rounds):
            dist.barrier()
            if r == 0:
                cpu0, machine0 = cpu_seconds(), machine_cpu_seconds()
            buf = data.clone() if r < 0 else data
            start = time.perf_counter()
            dist.all_reduce(buf)
            if r >= 0:
                times.append(time.perf_counter() - start)
        dist.barrier()
        cpu = cpu_seconds() - cpu0
        machine1 = machine_cpu_seconds()
        t = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(t)
        avg = (t / a.world).tolist()
    finally:
        dist.destroy_process_group()
    med = statistics.median(avg)
    alg = a.size_bytes * 8 / med / 1e9 if med > 0 else 0.0
    w = a.world
    out = {
        "impl": "gloo",
        "size_bytes": a.size_bytes,
        "peers": w,
        "median_s": med,
        "algbw_gbps": alg,
        "busbw_gbps": alg * 2 * (w - 1) / w,
        "cpu_s_per_gb": cpu / (a.size_bytes * a.rounds / 1e9),
    }
    if machine0 is not None and machine1 is not None:
        out["machine_cpu_s_per_gb"] = (machine1 - machine0) / (a.size_bytes * a.rounds / 1e9)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
