#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Issue 14's demo, end to end: an ImageFolder tree of a few hundred JPEG and PNG photos-to-be
# (three classes of generated pictures, many sizes and aspect ratios) converted at --size 40 into
# two shards (train) and one file (val), then resnet18 trained on 2 ranks with
# data.augment = "random-resized-crop", data.crop = 32, data.train as a glob of the shards.
# Accuracy must rise well above chance (1/3); `dptrain eval` reports per-class accuracy by the
# folder names, which also go into the checkpoint; `dptrain inspect` prints them.
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PY=/usr/bin/python3
if ! "$PY" -c 'import PIL, h5py, numpy' 2>/dev/null; then
  skip "no $PY with PIL, h5py and numpy (scripts/install-deps.sh installs python3-pil)"
  finish
fi
"$PY" - "$TMP" <<'PYEOF' || { fail "could not build the image folders"; finish; }
import os, sys
import numpy as np
from PIL import Image, ImageDraw
root = sys.argv[1]
rng = np.random.default_rng(14)
# Three classes a crop cannot confuse: a bright disc, horizontal stripes, a dark square frame,
# each on a noisy background of a random tint, at many sizes and aspect ratios.
def picture(cls, w, h):
    bg = rng.integers(0, 120, 3)
    a = np.clip(bg + rng.normal(0, 20, (h, w, 3)), 0, 255).astype(np.uint8)
    im = Image.fromarray(a)
    d = ImageDraw.Draw(im)
    if cls == 0:
        r = min(w, h) * rng.uniform(0.3, 0.45)
        cx, cy = w / 2 + rng.uniform(-0.1, 0.1) * w, h / 2 + rng.uniform(-0.1, 0.1) * h
        d.ellipse([cx - r, cy - r, cx + r, cy + r], fill=(250, 240, 120))
    elif cls == 1:
        step = max(3, int(h * rng.uniform(0.08, 0.15)))
        for y in range(0, h, 2 * step):
            d.rectangle([0, y, w, y + step - 1], fill=(230, 230, 230))
    else:
        t = max(2, int(min(w, h) * 0.12))
        d.rectangle([t, t, w - t - 1, h - t - 1], outline=(20, 200, 60), width=t)
    return im
names = ["disc", "stripes", "frame"]
for split, n in (("train", 120), ("val", 30)):
    for c, name in enumerate(names):
        os.makedirs(f"{root}/{split}/{name}", exist_ok=True)
        for i in range(n):
            w, h = int(rng.integers(40, 120)), int(rng.integers(40, 120))
            im = picture(c, w, h)
            if i % 3 == 0:
                im.save(f"{root}/{split}/{name}/{i:04d}.png")
            else:
                im.save(f"{root}/{split}/{name}/{i:04d}.jpg", quality=int(rng.integers(70, 95)))
PYEOF
pass "image folders: 360 train and 90 val JPEG/PNG images in 3 classes"

# 3 x 40 x 40 = 4800 bytes a sample: 1MB = 218 samples a shard, so 360 make 2 shards.
CASE="convert train --shard-size 1MB"
expect_ok -- "$DPTRAIN" convert --from imagefolder --input "$TMP/train" --out "$TMP/train.h5" \
  --size 40 --shard-size 1MB
mapfile -t SHARDS < <(compgen -G "$TMP/train-*.h5" | sort)
check "two train shards (${SHARDS[*]##*/})" test "${#SHARDS[@]}" -eq 2
CASE="convert val"
expect_ok -- "$DPTRAIN" convert --from imagefolder --input "$TMP/val" --out "$TMP/val.h5" --size 40
CASE="inspect names the classes"
expect_ok -- "$DPTRAIN" inspect "$TMP/val.h5"
check "inspect prints the class names" grep -q "names    0:disc 1:frame 2:stripes" "$TMP/last.out"

cat >"$TMP/run.toml" <<TOML
run_dir = "$TMP/run"
seed = 3
[model]
name = "resnet18"
classes = 3
[data]
train = "$TMP/train-*.h5"
test = "$TMP/val.h5"
augment = "random-resized-crop"
crop = 32
mean = [0.485, 0.456, 0.406]
std = [0.229, 0.224, 0.225]
workers = 1
[train]
epochs = 6
global_batch = 32
optimizer = "sgd"
lr = 0.05
momentum = 0.9
weight_decay = 1e-4
schedule = "cosine"
log_every_steps = 10
[checkpoint]
every_epochs = 6
TOML
CASE="resnet18, 2 ranks, random-resized-crop from two shards"
RUN_LIMIT=300 expect_ok -- "${MPI2[@]}" "$DPTRAIN" train --config "$TMP/run.toml"
acc=$(sed -n 's/^final: test_accuracy \([0-9.]*\).*/\1/p' "$TMP/last.out" | tail -n 1)
echo "  test accuracy ${acc:-none} (chance 0.33)"
check "test accuracy ${acc:-none} > 0.6 (chance 1/3)" \
  "$PY" -c "import sys; sys.exit(0 if float('${acc:-0}') > 0.6 else 1)"
check "the run saw 360 samples from the shards" grep -q "360 train samples" "$TMP/last.out"
check "the summary sets the loader's rate per thread against the step's consumption" \
  grep -qE "^data: the loader makes [0-9]+ samples/s per thread .*; training consumed [0-9]+ samples/s per rank$" "$TMP/last.out"
ck=$(compgen -G "$TMP/run/checkpoints/ckpt-*.h5" | sort | tail -n 1)
check "the checkpoint carries the class names" \
  "$PY" -c "import h5py, sys; sys.exit(0 if h5py.File('$ck')['/'].attrs['class_names'] == 'disc\nframe\nstripes' else 1)"
CASE="eval reports per-class accuracy by name"
expect_ok -- "${MPI2[@]}" "$DPTRAIN" eval --config "$TMP/run.toml" --checkpoint "$ck"
check "per-class table with the folder names" \
  bash -c "grep -q '^per class:' '$TMP/last.out' && grep -qE '^  disc +[01]\.[0-9]{4} +30$' '$TMP/last.out' && grep -qE '^  frame ' '$TMP/last.out'"

# configs/imagenet_resnet50.toml: `dptrain plan --ranks 8` reports the memory per GPU (no GPU
# here: the CPU backend's shapes, said so).
CASE="plan the ImageNet recipe on 8 ranks"
expect_ok -- "$DPTRAIN" plan --config "$DPTRAIN_SRC/configs/imagenet_resnet50.toml" --ranks 8
check "plan: 8 ranks, 32 per rank, input [3, 224, 224] per GPU, a total" \
  bash -c "grep -q '^8 ranks, global batch 256 -> 32 per rank, input \\[3, 224, 224\\] (per GPU' '$TMP/last.out' && grep -qE '^total +[0-9.]+\$' '$TMP/last.out'"
grep -E '^(total|none|optimizer|gradients) ' "$TMP/last.out" | sed 's/^/  /'
finish
