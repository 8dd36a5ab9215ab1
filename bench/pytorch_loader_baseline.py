#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The loader bench's PyTorch side (bench/loader.sh): what one DataLoader worker does per batch
for the same job as build/bench/loader_bench, on one thread. 256 x 256 uint8 samples held in RAM
as a tensor; per sample torchvision's RandomResizedCrop(224) (bilinear, no antialiasing: dptrain's
choice too) and RandomHorizontalFlip, to float / 255, Normalize; default_collate's stack into
batches of 64. Prints `samples_per_s N` for the random-resized-crop and the centre-crop job."""
import argparse
import time

import torch
import torchvision.transforms as T

ap = argparse.ArgumentParser()
ap.add_argument("--samples", type=int, default=512)
ap.add_argument("--seconds", type=float, default=3.0)
a = ap.parse_args()
torch.set_num_threads(1)
torch.manual_seed(1)
data = torch.randint(0, 256, (a.samples, 3, 256, 256), dtype=torch.uint8)
norm = T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
jobs = {
    "random-resized-crop": T.Compose([T.RandomResizedCrop(224, antialias=False),
                                      T.RandomHorizontalFlip()]),
    "centre-crop": T.CenterCrop(224),
}
for name, geometry in jobs.items():
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < a.seconds:
        for b in range(0, a.samples - 63, 64):
            batch = torch.stack([norm(geometry(data[i]).float().div_(255))
                                 for i in range(b, b + 64)])
            done += batch.shape[0]
    print(f"{name} samples_per_s {done / (time.perf_counter() - t0):.0f}")
