#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""PyTorch baseline for bench/run.sh: the same reference CNN, batch, optimizer and in-RAM data
as dptrain's ref_cnn benchmark. Prints one line: `pytorch <mode> <ranks>x<threads> batch <B>
<precision> samples_per_s <X>`.

Single process: torch.set_num_threads(threads). Data parallel: DistributedDataParallel over gloo
with processes spawned by torch.multiprocessing (torch.distributed.run of Debian's torch 1.13
crashes under Python 3.11). OpenBLAS is pinned to one thread (fastest here; see recipes)."""
import argparse
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class RefCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(3136, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        return self.fc2(F.relu(self.fc1(x)))


def train(rank, world, args, result):
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    model = RefCnn()
    if world > 1:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ.setdefault("MASTER_PORT", "29533")
        torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    b = args.batch // world
    data = torch.rand(2048, 1, 28, 28)
    labels = torch.randint(0, 10, (2048,))
    dtype = torch.bfloat16 if args.precision == "bf16" else None

    def step(i):
        lo = (i * b) % (2048 - b)
        x, y = data[lo:lo + b], labels[lo:lo + b]
        if dtype is not None:
            with torch.autocast("cpu", dtype=dtype):
                loss = F.cross_entropy(model(x), y)
        else:
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for i in range(args.warmup):
        step(i)
    if world > 1:
        torch.distributed.barrier()
    t0 = time.perf_counter()
    for i in range(args.steps):
        step(i)
    if world > 1:
        torch.distributed.barrier()
    dt = time.perf_counter() - t0
    if rank == 0:
        result.put(args.steps * args.batch / dt)
    if world > 1:
        torch.distributed.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    args = p.parse_args()
    ctx = torch.multiprocessing.get_context("spawn")
    result = ctx.SimpleQueue()
    if args.ranks == 1:
        train(0, 1, args, result)
    else:
        procs = [ctx.Process(target=train, args=(r, args.ranks, args, result))
                 for r in range(args.ranks)]
        for pr in procs:
            pr.start()
        for pr in procs:
            pr.join()
            if pr.exitcode != 0:
                sys.exit("pytorch baseline: a rank failed")
    sps = result.get()
    print(f"pytorch {args.ranks}x{args.threads} batch {args.batch} {args.precision} "
          f"samples_per_s {sps:.0f}")


if __name__ == "__main__":
    main()
