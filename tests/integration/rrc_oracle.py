#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""torchvision's RandomResizedCrop.get_params on fixed random draws: the oracle for
tests/unit/augment_test.cc's table of crop boxes.

torch's random calls inside get_params are replaced by draws from the sequence
u_k = frac(k * 0.6180339887498949), k = k0 + 1, k0 + 2, ... (the same sequence the C++ test
feeds RandomResizedCropBox): uniform_(a, b) gives float32(a + (b - a) * u), randint(0, n)
floor(u * n). Prints one C++ table row per case; with --check FILE, compares them with the
rows between the markers in FILE and exits 1 on any difference.
"""
import math
import sys

import torch
from torchvision.transforms import RandomResizedCrop

PHI = 0.6180339887498949
CASES = [(h, w, k0) for (h, w) in [(256, 256), (256, 341), (500, 375), (32, 32), (10, 200),
                                   (200, 12), (224, 224), (257, 300)]
         for k0 in range(0, 400, 16)]


class Draws:
    def __init__(self, k0):
        self.k = k0

    def next(self):
        self.k += 1
        x = self.k * PHI
        return x - math.floor(x)


def boxes():
    rows = []
    real_empty, real_randint = torch.empty, torch.randint
    for h, w, k0 in CASES:
        d = Draws(k0)

        class Fake:
            def uniform_(self, a, b):
                a, b = float(a), float(b)
                return torch.tensor([a + (b - a) * d.next()], dtype=torch.float32)

        torch.empty = lambda *a, **k: Fake()
        torch.randint = lambda lo, hi, size: torch.tensor([lo + math.floor(d.next() * (hi - lo))])
        try:
            i, j, bh, bw = RandomResizedCrop.get_params(torch.zeros(3, h, w), [0.08, 1.0],
                                                        [3.0 / 4.0, 4.0 / 3.0])
        finally:
            torch.empty, torch.randint = real_empty, real_randint
        rows.append(f"    {{{h}, {w}, {k0}, {{{i}, {j}, {bh}, {bw}}}}},")
    return rows


def main():
    rows = boxes()
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        text = open(sys.argv[2]).read().splitlines()
        begin = text.index("    // BEGIN torchvision boxes") + 1
        end = text.index("    // END torchvision boxes")
        have = [r for r in text[begin:end]]
        if have != rows:
            diff = [(a, b) for a, b in zip(have, rows) if a != b]
            print(f"{len(have)} rows in {sys.argv[2]}, {len(rows)} from torchvision; "
                  f"first differences: {diff[:5]}")
            return 1
        print(f"{len(rows)} crop boxes agree with torchvision's RandomResizedCrop.get_params")
        return 0
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
