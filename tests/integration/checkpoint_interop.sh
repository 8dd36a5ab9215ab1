#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Interop: a dptrain checkpoint read with h5py alone (names and shapes of ref_cnn as DESIGN.md
# section 5 lists them, dtypes, every crc32 = zlib.crc32, /state, /config as TOML), and the
# PyTorch snippet of docs/checkpoints.md run as written (Debian's python3-torch): it loads the
# checkpoint with strict=True and the torch model's test loss and accuracy equal `dptrain
# eval`'s. Also a batch-norm model (running statistics, num_batches_tracked) into an
# nn.Sequential, and the reverse: a DataParallel-wrapped torch state_dict written with h5py
# evaluates the same in dptrain (module. prefix stripped).
# shellcheck disable=SC2034  # CASE is read by expect_ok / expect_fail (lib.sh)
# shellcheck source=checkpoint_common.sh
. "$(dirname "${BASH_SOURCE[0]}")/checkpoint_common.sh"

A=$TMP/a
CASE="train ref_cnn, 1 process, 16 steps"
expect_ok -- "$DPTRAIN" train --config "$CONFIG" --set "run_dir=$A"
CK=$(ckpt "$A" 16)

echo "== h5py only"
check "names, shapes, dtypes, checksums, /state and /config" "$PY" - "$CK" "$CKPT_PY" <<'EOF'
import os, sys, tomllib, zlib
import h5py, numpy as np
sys.path.insert(0, os.path.dirname(sys.argv[2]))
from ckpt_tool import state_lines  # checkpoint_common.sh
expected = {  # DESIGN.md section 5
    "conv1.weight": (32, 1, 3, 3), "conv1.bias": (32,),
    "conv2.weight": (64, 32, 3, 3), "conv2.bias": (64,),
    "fc1.weight": (128, 3136), "fc1.bias": (128,),
    "fc2.weight": (10, 128), "fc2.bias": (10,),
}
with h5py.File(sys.argv[1], "r") as f:
    got = {k: d.shape for k, d in f["params"].items()}
    assert got == expected, got
    for k, d in f["params"].items():
        assert d.dtype == np.float32, (k, d.dtype)
        assert zlib.crc32(d[()].tobytes()) == int(d.attrs["crc32"]), k
    for k in expected:
        slot = f["optimizer"][k]["momentum_buffer"]
        assert slot.shape == expected[k] and slot.dtype == np.float32, k
        assert zlib.crc32(slot[()].tobytes()) == int(slot.attrs["crc32"]), k
    assert f["optimizer"].attrs["kind"] == "sgd"
    s = dict(f["state"].attrs)
    for key in ("step", "epoch", "samples_in_epoch", "seed", "world_size_at_save",
                "global_batch", "format_version", "dptrain_version", "optimizer_steps",
                "schedule_step", "rng_state"):
        assert key in s, key
    assert (s["step"], s["epoch"], s["samples_in_epoch"]) == (16, 0, 16 * 64), s
    assert (s["global_batch"], s["world_size_at_save"], s["format_version"]) == (64, 1, 1), s
    lines = state_lines(s)
    assert zlib.crc32(lines.encode()) == int(s["crc32"]), ("/state crc32", lines)
    config = tomllib.loads(f["config"][()].decode())
    assert config["model"]["name"] == "ref_cnn" and config["train"]["global_batch"] == 64
print("h5py: 8 parameters with ref_cnn's names and shapes, 8 momentum buffers, checksums ok "
      "(/state's too)")
EOF

echo "== the PyTorch snippet of docs/checkpoints.md"
SNIPPET=$TMP/snippet.py
awk '/<!-- snippet: pytorch-load/ { on = 1; next }
     on && /^```python/ { code = 1; next }
     code && /^```/ { exit }
     code { print }' "$DPTRAIN_SRC/docs/checkpoints.md" >"$SNIPPET"
check "the snippet is in docs/checkpoints.md" grep -q "strict=True" "$SNIPPET"
TORCH_PY=/usr/bin/python3
if ! "$TORCH_PY" -c 'import torch, h5py' 2>/dev/null; then
  skip "no python3 with torch and h5py (Debian: python3-torch python3-h5py)"
  finish
fi
# The snippet loads "runs/fmnist/checkpoints/ckpt-00000016.h5" relative to the current directory.
mkdir -p "$TMP/cwd/runs/fmnist/checkpoints"
cp "$CK" "$TMP/cwd/runs/fmnist/checkpoints/"
CASE="dptrain eval of the checkpoint"
expect_ok -- "$DPTRAIN" eval --config "$CONFIG" --checkpoint "$CK"
EVAL=$(grep -o 'test_loss [0-9.]* test_accuracy [0-9.]*' "$TMP/last.out")
echo "  dptrain: $EVAL"

# Evaluation on the test set in torch, as dptrain normalises it; compared with dptrain eval.
cat >"$TMP/torch_eval.py" <<'EOF'
import sys
import h5py, numpy as np, torch

def evaluate(model, test_h5, mean=0.2860, std=0.3530):
    with h5py.File(test_h5, "r") as f:
        x = f["images"][()].astype(np.float32) / np.float32(255)
        y = f["labels"][()].astype(np.int64)
    x = (x - np.float32(mean)) * (np.float32(1) / np.float32(std))
    if x.ndim == 3:
        x = x[:, None]
    with torch.no_grad():
        out = model(torch.from_numpy(x))
        loss = torch.nn.functional.cross_entropy(out.double(), torch.from_numpy(y)).item()
        acc = (out.argmax(1).numpy() == y).mean()
    return loss, acc

def compare(loss, acc, dptrain_line, what):
    words = dptrain_line.split()
    d_loss, d_acc = float(words[1]), float(words[3])
    print(f"{what}: torch test_loss {loss:.6f} test_accuracy {acc:.4f}; "
          f"dptrain test_loss {d_loss:.6f} test_accuracy {d_acc:.4f}")
    assert abs(loss - d_loss) <= 2e-4 * max(1.0, d_loss), (loss, d_loss)
    assert abs(acc - d_acc) <= 2e-4, (acc, d_acc)
EOF
cat >"$TMP/run_snippet.py" <<EOF
import sys
sys.path.insert(0, "$TMP")
exec(open("$SNIPPET").read())  # as written in the docs: defines RefCnn, loads model
from torch_eval import evaluate, compare
loss, acc = evaluate(model, sys.argv[1])
compare(loss, acc, sys.argv[2], "ref_cnn")
EOF
check "the snippet loads the checkpoint (strict=True) and torch evaluates it as dptrain does" \
  env -C "$TMP/cwd" "$TORCH_PY" "$TMP/run_snippet.py" \
  "$DPTRAIN_DATA/fmnist/test.h5" "$EVAL"

echo "== a batch-norm model into torch.nn.Sequential"
BN=$TMP/bn.toml
"$PY" - "$CONFIG" "$BN" <<'EOF'
import sys
text = open(sys.argv[1]).read()
layers = """[model]
classes = 10
layers = [
  { type = "conv2d", name = "c1", out = 8, kernel = 3, pad = 1 },
  { type = "batchnorm", name = "bn" },
  { type = "relu", name = "act" },
  { type = "maxpool", name = "pool" },
  { type = "flatten", name = "flat" },
  { type = "linear", name = "fc", out = 10 },
]
"""
text = text.replace('[model]\nname = "ref_cnn"\nclasses = 10\n', layers)
assert "layers" in text
open(sys.argv[2], "w").write(text)
EOF
CASE="train a conv-batchnorm model, 1 process, 16 steps"
expect_ok -- "$DPTRAIN" train --config "$BN" --set "run_dir=$TMP/bn" --set train.lr=0.02
CASE="dptrain eval of it"
expect_ok -- "$DPTRAIN" eval --config "$BN" --checkpoint "$(ckpt "$TMP/bn" 16)"
EVAL_BN=$(grep -o 'test_loss [0-9.]* test_accuracy [0-9.]*' "$TMP/last.out")
check "running statistics and num_batches_tracked load with strict=True; torch matches dptrain" \
  "$TORCH_PY" - "$(ckpt "$TMP/bn" 16)" "$DPTRAIN_DATA/fmnist/test.h5" "$EVAL_BN" <<EOF
import sys
from collections import OrderedDict
sys.path.insert(0, "$TMP")
exec(open("$SNIPPET").read().split("\nmodel = ")[0])  # the snippet's definitions
from torch_eval import evaluate, compare
net = nn.Sequential(OrderedDict(
    c1=nn.Conv2d(1, 8, 3, padding=1), bn=nn.BatchNorm2d(8), act=nn.ReLU(),
    pool=nn.MaxPool2d(2), flat=nn.Flatten(), fc=nn.Linear(8 * 14 * 14, 10)))
load_dptrain_checkpoint(sys.argv[1], net).eval()
assert net.bn.num_batches_tracked.item() == 16, net.bn.num_batches_tracked
assert float(net.bn.running_var.min()) != 1.0  # trained statistics, not the initial ones
loss, acc = evaluate(net, sys.argv[2])
compare(loss, acc, sys.argv[3], "conv-bn")
EOF

echo "== the reverse: a DataParallel-wrapped torch state_dict into dptrain"
check "export a torch ref_cnn (random init, module. prefix) with h5py" \
  "$TORCH_PY" - "$TMP/torch.h5" "$DPTRAIN_DATA/fmnist/test.h5" <<EOF
import sys
sys.path.insert(0, "$TMP")
exec(open("$SNIPPET").read().split("\nmodel = ")[0])
from torch_eval import evaluate
torch.manual_seed(3)
wrapped = nn.DataParallel(RefCnn())
with h5py.File(sys.argv[1], "w") as f:
    for name, t in wrapped.state_dict().items():
        assert name.startswith("module.")
        f["params/" + name] = t.numpy()
loss, acc = evaluate(wrapped.module.eval(), sys.argv[2])
open("$TMP/torch_eval.txt", "w").write(f"test_loss {loss:.6f} test_accuracy {acc:.4f}")
EOF
CASE="dptrain eval of the torch export"
expect_ok -- "$DPTRAIN" eval --config "$CONFIG" --checkpoint "$TMP/torch.h5"
check "the module. prefix is stripped with a notice" \
  grep -qF "every name in /params starts with 'module.'" "$TMP/last.out"
EVAL_T=$(grep -o 'test_loss [0-9.]* test_accuracy [0-9.]*' "$TMP/last.out")
echo "  dptrain: $EVAL_T"
echo "  torch:   $(cat "$TMP/torch_eval.txt")"
check "dptrain evaluates the torch weights as torch does" "$PY" -c "
a, b = '$EVAL_T'.split(), open('$TMP/torch_eval.txt').read().split()
assert abs(float(a[1]) - float(b[1])) <= 2e-4 and abs(float(a[3]) - float(b[3])) <= 2e-4, (a, b)"
CASE="checkpoint.init from the torch export"
expect_ok -- "$DPTRAIN" train --config "$CONFIG" --set "run_dir=$TMP/from-torch" \
  --set "checkpoint.init=$TMP/torch.h5" --set train.max_steps=2
check "it says so" grep -qF "parameters initialised from $TMP/torch.h5" "$TMP/last.out"

finish
