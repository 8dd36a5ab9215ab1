#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# model.onnx against PyTorch: torchvision resnet18, resnet50, mobilenet_v2, mobilenet_v3_small,
# vgg11_bn and squeezenet1_1 (ceil-mode pooling), and a small network of the remaining ops
# ("ops" in onnx_oracle.py: padding, a per-channel add, averages with and without the padding,
# a linear layer without bias), exported in training mode take one plain SGD step on a fixed
# batch of 16 in dptrain
# and in PyTorch; every parameter must agree to 1e-3 of the update, every batch-norm buffer to
# 1e-4 (against PyTorch's float64 step, see onnx_oracle.py), and the dptrain checkpoint must load
# into the torchvision model with strict=True (tests/integration/onnx_oracle.py); on 2 ranks it
# trains and loads. resnet18 also: PyTorch's stepped weights as a DataParallel state_dict
# through checkpoint.init and dptrain eval, bf16 and fp16, and an exact resume. Then the bad
# files: not ONNX, truncated, an unsupported op or attribute, two inputs, a wrong initializer, a
# wrong model.classes: each exit 2 with one message naming the file (and node). The CPU backend
# runs it as integration.onnx_import; the CUDA backend as cuda.onnx_import (ONNX_DEVICE=cuda).
# shellcheck disable=SC2034  # CASE is read by expect_ok / expect_fail (lib.sh)
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# DPTRAIN_TORCH_PYTHON: a python3 with torch, torchvision, onnx and h5py (a GPU machine's venv);
# Debian's /usr/bin/python3 by default.
PY=${DPTRAIN_TORCH_PYTHON:-/usr/bin/python3}
# One python start for both: the modules must import, and their versions key the oracle cache.
if ! PY_VERSIONS=$("$PY" -c 'import sys, torch, torchvision, onnx, numpy, h5py
print(sys.version.split()[0], torch.__version__, torchvision.__version__, onnx.__version__,
      numpy.__version__)' 2>/dev/null); then
  skip "no python3 with torch, torchvision, onnx and h5py (scripts/install-deps.sh installs them)"
  finish
fi
ORACLE=$DPTRAIN_SRC/tests/integration/onnx_oracle.py

# oracle_export DIR MODEL [ARGS...]: `onnx_oracle.py export MODEL DIR ARGS...` (the model file,
# the batch and PyTorch's float32 and float64 steps: about 110 s of the test's 360 s on a 2-core
# AMD EPYC, most of it resnet50's float64 gradients), kept in DPTRAIN_ORACLE_CACHE (default
# ~/.cache/dptrain-onnx-oracle; "off": always computed). The export is deterministic (fixed seeds)
# and reads nothing of dptrain's, so its key is everything it depends on: the oracle script, the
# versions of python, torch, torchvision, onnx and numpy, and the arguments. Every dptrain step
# and comparison below still runs each time.
ORACLE_CACHE=${DPTRAIN_ORACLE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dptrain-onnx-oracle}
ORACLE_SALT="$(sha256sum <"$ORACLE") $PY_VERSIONS"
oracle_export() {
  local dir=$1 key
  shift
  key=$(echo "$ORACLE_SALT $*" | sha256sum | cut -c1-40)
  if [[ $ORACLE_CACHE != off && -f $ORACLE_CACHE/$key/after.pt ]]; then
    echo "PyTorch's export and step for '$*' from $ORACLE_CACHE/$key"
    cp -a "$ORACLE_CACHE/$key/." "$dir/"
    return 0
  fi
  "$PY" "$ORACLE" export "$1" "$dir" "${@:2}" || return 1
  [[ $ORACLE_CACHE == off ]] && return 0
  # Written under a temporary name, then renamed: a cut-off run never leaves a torn entry.
  mkdir -p "$ORACLE_CACHE" && rm -rf "$ORACLE_CACHE/$key.tmp.$$" &&
    cp -a "$dir/." "$ORACLE_CACHE/$key.tmp.$$/" &&
    { mv -T "$ORACLE_CACHE/$key.tmp.$$" "$ORACLE_CACHE/$key" 2>/dev/null ||
      rm -rf "$ORACLE_CACHE/$key.tmp.$$"; }
  return 0
}

# ONNX_DEVICE=cuda (ctest's cuda.onnx_import) runs everything on the CUDA backend, the 2-rank
# cases with two GPUs or more; without a usable GPU it is skipped (exit 77).
DEVICE=${ONNX_DEVICE:-cpu}
NGPU=0
if [[ $DEVICE == cuda ]]; then require_cuda; fi
# Two ranks: always on CPU; on CUDA with a GPU each.
two_ranks() { [[ $DEVICE == cpu || $NGPU -ge 2 ]]; }

# config DIR: one SGD step of lr 0.1 on DIR/batch.h5 (16 samples, one global batch), no
# normalisation, a checkpoint after the step.
config() {
  cat >"$1/run.toml" <<TOML
run_dir = "$1/run"
seed = 1
[model]
onnx = "$1/model.onnx"
classes = 10
[data]
train = "$1/batch.h5"
mean = [0.0, 0.0, 0.0]
std = [1.0, 1.0, 1.0]
shuffle = false
[train]
global_batch = 16
max_steps = 1
optimizer = "sgd"
lr = 0.1
momentum = 0.0
weight_decay = 0.0
log_every_steps = 1
# Strict fp32 on GPUs: the parity bounds are fp32's (TF32 is checked against its own 1% bound by
# cuda_tests' Tf32StaysWithinOnePercentOfTheCpuBackend); no effect on the CPU.
tf32 = false
[checkpoint]
every_steps = 1
every_epochs = 0
[dist]
device = "$DEVICE"
TOML
}

# On CPU the default step runs channels-last (model.channels_last): it is held to the larger of
# PyTorch's NCHW and channels_last float32 errors, and the NCHW step below to PyTorch's NCHW one.
# ReLU inputs within float32 rounding of zero may gate either way in any float32 program
# (onnx_oracle.py's header): resnet50 has 70 such gates at this batch, vgg11_bn 2; the
# comparison allows each tensor what those gates can move it by.
LAYOUT=nchw
if [[ $DEVICE == cpu ]]; then LAYOUT=channels_last; fi
# ONNX_MODELS (a developer's knob): a subset, space-separated; the cases after the loop need
# resnet18 and ops.
read -r -a MODELS <<<"${ONNX_MODELS:-resnet18 resnet50 mobilenet_v2 mobilenet_v3_small vgg11_bn squeezenet1_1 ops}"
for MODEL in "${MODELS[@]}"; do
  D=$TMP/$MODEL
  mkdir -p "$D"
  check "$MODEL: export in training mode and take PyTorch's SGD step" \
    oracle_export "$D" "$MODEL"
  config "$D"
  CASE="$MODEL: one SGD step in dptrain, 1 process"
  expect_ok -- "$DPTRAIN" train --config "$D/run.toml"
  runs=("$D/run/checkpoints/ckpt-00000001.h5" "$LAYOUT")
  what="1 process"
  if [[ $DEVICE == cpu ]]; then
    CASE="$MODEL: one SGD step with model.channels_last = false (NCHW)"
    expect_ok -- "$DPTRAIN" train --config "$D/run.toml" --set model.channels_last=false \
      --set "run_dir=$D/run_nchw"
    runs+=("$D/run_nchw/checkpoints/ckpt-00000001.h5" nchw)
    what="1 process, channels-last and NCHW"
  fi
  # Both steps against one load of PyTorch's (vgg11_bn's float64 step alone is 2.6 GB).
  check "$MODEL, $what: parameters and buffers equal PyTorch's; strict=True load" \
    "$PY" "$ORACLE" compare "$MODEL" "$D" "${runs[@]}"
  # On 2 ranks batch norm normalises each rank's 8 samples by their own statistics (as DDP
  # does), so the step differs from the 16-sample one; the checkpoint must still load.
  two_ranks || continue
  CASE="$MODEL: the same step on 2 ranks (8 samples each)"
  expect_ok -- "${MPI2[@]}" "$DPTRAIN" train --config "$D/run.toml" --set "run_dir=$D/run2"
  check "$MODEL, 2 ranks: the checkpoint loads with strict=True" \
    "$PY" "$ORACLE" load "$MODEL" "$D" "$D/run2/checkpoints/ckpt-00000001.h5"
done

D=$TMP/recipe
mkdir -p "$D"
check "ops: PyTorch's step with label_smoothing=0.1, clip_grad_norm_(0.5), weight decay 0.01 but on biases and batch norm" \
  oracle_export "$D" ops 0.1 0.5 0.01
config "$D"
CASE="ops: the step with train.label_smoothing = 0.1, train.clip_grad_norm = 0.5, train.weight_decay = 0.01, train.no_weight_decay = [\"bias\", \"bn\"]"
expect_ok -- "$DPTRAIN" train --config "$D/run.toml" --set train.label_smoothing=0.1 \
  --set train.clip_grad_norm=0.5 --set train.weight_decay=0.01 \
  --set 'train.no_weight_decay=["bias", "bn"]'
check "ops, the recipe knobs: parameters and buffers equal PyTorch's" \
  "$PY" "$ORACLE" compare ops "$D" "$D/run/checkpoints/ckpt-00000001.h5" "$LAYOUT"
D=$TMP/lars
mkdir -p "$D"
check "ops: PyTorch's LARS step (eta 0.02, weight decay 0.01, biases and batch norm excluded)" \
  oracle_export "$D" ops 0 0 0.01 0.02
config "$D"
CASE="ops: the step with train.optimizer = \"lars\""
expect_ok -- "$DPTRAIN" train --config "$D/run.toml" --set train.optimizer=lars \
  --set train.lars_eta=0.02 --set train.weight_decay=0.01 \
  --set 'train.no_weight_decay=["bias", "bn"]'
check "ops, LARS: parameters and buffers equal PyTorch's" \
  "$PY" "$ORACLE" compare ops "$D" "$D/run/checkpoints/ckpt-00000001.h5" "$LAYOUT"

D=$TMP/ops
CASE="ops with the padding merged into the conv (pads 0, 1, 2, 1): the same step"
expect_ok -- "$DPTRAIN" train --config "$D/run.toml" --set "model.onnx=$D/model_fused.onnx" \
  --set "run_dir=$D/run_fused"
check "ops, uneven conv pads: parameters and buffers equal PyTorch's" \
  "$PY" "$ORACLE" compare ops "$D" "$D/run_fused/checkpoints/ckpt-00000001.h5" "$LAYOUT"

echo "== resnet18: PyTorch's weights in (checkpoint.init, dptrain eval), bf16 and fp16, resume"
D=$TMP/resnet18
check "PyTorch's stepped resnet18 written as a DataParallel state_dict (module. names)" \
  "$PY" "$ORACLE" torch_ckpt resnet18 "$D" "$D/torch.h5"
CASE="dptrain eval of PyTorch's weights"
expect_ok -- "$DPTRAIN" eval --config "$D/run.toml" --set "data.test=$D/batch.h5" \
  --checkpoint "$D/torch.h5"
EVAL=$(grep -o 'test_loss [0-9.]* test_accuracy [0-9.]*' "$TMP/last.out")
read -r _ TORCH_LOSS _ TORCH_ACC <"$D/torch_eval.txt"
echo "  dptrain: $EVAL"
echo "  torch:   test_loss $TORCH_LOSS test_accuracy $TORCH_ACC"
check "eval-mode loss (batch norm's running statistics) as PyTorch's to 1e-4" \
  "$PY" "$ORACLE" close "$(echo "$EVAL" | awk '{print $2}')" "$TORCH_LOSS" 1e-4
check "the same accuracy" test "$(echo "$EVAL" | awk '{print $4}')" = "$TORCH_ACC"
CASE="checkpoint.init from PyTorch's weights"
expect_ok -- "$DPTRAIN" train --config "$D/run.toml" --set "run_dir=$D/init" \
  --set "checkpoint.init=$D/torch.h5"
check "it says so" grep -qF "parameters initialised from $D/torch.h5" "$TMP/last.out"
check "the checkpoint after a step from them loads with strict=True" \
  "$PY" "$ORACLE" load resnet18 "$D" "$D/init/checkpoints/ckpt-00000001.h5"
# The step-1 loss in metrics.jsonl: bf16 and fp16 (emulated on CPU) start from the same weights.
loss1() {
  "$PY" -c 'import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print(next(r["loss"] for r in rows if r.get("kind") == "step" and r["step"] == 1))' \
    "$1/metrics.jsonl"
}
for P in bf16 fp16; do
  CASE="resnet18 in $P"
  if expect_ok -- "$DPTRAIN" train --config "$D/run.toml" --set "run_dir=$D/$P" \
    --set "train.precision=$P"; then
    check "$P: the step-1 loss within 1% of fp32's" \
      "$PY" "$ORACLE" close "$(loss1 "$D/$P")" "$(loss1 "$D/run")" 1e-2
  fi
done
CASE="2 steps with momentum, uninterrupted"
expect_ok -- "$DPTRAIN" train --config "$D/run.toml" --set "run_dir=$D/full" \
  --set train.max_steps=2 --set train.momentum=0.9 --set train.deterministic=true
mkdir -p "$D/part/checkpoints"
cp "$D/full/checkpoints/ckpt-00000001.h5" "$D/part/checkpoints/"
CASE="the same run resumed from its step-1 checkpoint"
expect_ok -- "$DPTRAIN" train --config "$D/run.toml" --set "run_dir=$D/part" \
  --set train.max_steps=2 --set train.momentum=0.9 --set train.deterministic=true
check "it resumed" grep -qF "resuming from $D/part/checkpoints/ckpt-00000001.h5" "$TMP/last.out"
check "parameters and momentum bitwise equal to the uninterrupted run's" \
  "$PY" "$ORACLE" same "$D/part/checkpoints/ckpt-00000002.h5" \
  "$D/full/checkpoints/ckpt-00000002.h5"

echo "== dptrain inspect"
"$DPTRAIN" inspect "$TMP/resnet18/model.onnx" >"$TMP/inspect.txt" 2>&1
check "inspect prints each node's op, output shape and parameters" \
  grep -qE '^/layer4/layer4.1/conv2/Conv +Conv +\[1, 512, 1, 1\] +2359296$' "$TMP/inspect.txt"
check "inspect counts the parameters" grep -qF "11181642 parameters" "$TMP/inspect.txt"

echo "== dptrain plan, the out-of-memory report and memory.auto_microbatch on graph nodes"
D=$TMP/resnet18
"$DPTRAIN" plan --config "$D/run.toml" >"$TMP/plan.txt" 2>&1
check "plan lists the ONNX nodes" grep -qE '^/layer4/layer4.1/conv2/Conv +conv2d ' "$TMP/plan.txt"
CASE="out of memory under memory.limit = 30MiB"
expect_fail 4 "out of memory on $DEVICE allocating" -- "$DPTRAIN" train --config "$D/run.toml" \
  --set memory.limit=30MiB --set "run_dir=$TMP/oom"
check "the report names the ONNX node" \
  grep -qE 'out of memory on .* allocating .* \(layer /[^)]+\)$' "$TMP/last.err"
if [[ $DEVICE == cpu ]]; then  # the limit is set from the CPU backend's measured peak
  CASE="resnet18 at micro-batch 16: its peak memory"
  expect_ok -- "$DPTRAIN" train --config "$D/run.toml" --set "run_dir=$D/peak"
  LIMIT=$(limit_under_peak 4)
  CASE="memory.auto_microbatch under memory.limit = ${LIMIT}MiB (4 MiB under that peak: the activations of micro-batch 16 are a few MiB next to 85 MiB of weights and gradients)"
  expect_ok -- "$DPTRAIN" train --config "$D/run.toml" --set "run_dir=$D/amb" \
    --set "memory.limit=${LIMIT}MiB" --set memory.auto_microbatch=true
  check "it trains at micro-batch 8 x 2" \
    grep -qF "memory.auto_microbatch: training with micro-batch 8 x 2 micro-steps" "$TMP/last.out"
fi

echo "== bad files"
D=$TMP/resnet18
printf 'not a model\n' >"$TMP/text.onnx"
CASE="a text file"
expect_fail 2 "is not an ONNX model" -- \
  "$DPTRAIN" train --config "$D/run.toml" --set "model.onnx=$TMP/text.onnx"
head -c 100000 "$D/model.onnx" >"$TMP/truncated.onnx"
CASE="a truncated file"
expect_fail 2 "$TMP/truncated.onnx is not" -- \
  "$DPTRAIN" train --config "$D/run.toml" --set "model.onnx=$TMP/truncated.onnx"
CASE="a missing file"
expect_fail 2 "model.onnx: $TMP/none.onnx: no such file" -- \
  "$DPTRAIN" train --config "$D/run.toml" --set "model.onnx=$TMP/none.onnx"
CASE="a directory"
expect_fail 2 "model.onnx: $TMP: is a directory, expected an ONNX model" -- \
  "$DPTRAIN" train --config "$D/run.toml" --set "model.onnx=$TMP"
# Opening a FIFO for reading waits for a writer: the check must answer without opening it.
mkfifo "$TMP/pipe.onnx"
CASE="a FIFO (no hang)"
expect_fail 2 "model.onnx: $TMP/pipe.onnx: cannot read the file: it is not a regular file" -- \
  "$DPTRAIN" train --config "$D/run.toml" --set "model.onnx=$TMP/pipe.onnx"
# More than protobuf's 2 GiB (a sparse file: nothing is written), refused before it is read.
truncate -s 3G "$TMP/huge.onnx"
CASE="a 3 GiB file"
expect_fail 2 "model.onnx: $TMP/huge.onnx: is 3221225472 bytes, more than the 2147483647 bytes an ONNX model can be" -- \
  "$DPTRAIN" train --config "$D/run.toml" --set "model.onnx=$TMP/huge.onnx"
rm -f "$TMP/huge.onnx"

"$PY" - "$TMP" "$(dirname "$ORACLE")" <<'PYEOF'
import sys
import onnx, onnx.numpy_helper, torch
out = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from onnx_oracle import EXPORT as kw
class Leaky(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.fc = torch.nn.Linear(4 * 30 * 30, 10)
    def forward(self, x):
        return self.fc(torch.flatten(torch.nn.functional.leaky_relu(self.conv(x)), 1))
class View(torch.nn.Module):
    def __init__(self, dynamic):
        super().__init__()
        self.dynamic = dynamic
        self.conv = torch.nn.Conv2d(3, 4, 3, stride=2)
        self.fc = torch.nn.Linear(4 * 15 * 15, 10)
    def forward(self, x):
        y = torch.relu(self.conv(x))
        return self.fc(y.view(y.size(0), -1) if self.dynamic else y.view(-1, 4 * 15 * 15))
class TwoInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3 * 32 * 32, 10)
    def forward(self, x, z):
        return self.fc(torch.flatten(x + z, 1))
class Reflect(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.pad = torch.nn.ReflectionPad2d(1)
        self.fc = torch.nn.Linear(3 * 34 * 34, 10)
    def forward(self, x):
        return self.fc(torch.flatten(self.pad(x), 1))
class RawMatMul(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(3 * 32 * 32, 10))
    def forward(self, x):
        return torch.flatten(x, 1) @ self.w
x = torch.zeros(2, 3, 32, 32)
torch.onnx.export(Leaky(), x, f"{out}/leaky.onnx", **kw)
torch.onnx.export(TwoInputs(), (x, x), f"{out}/two_inputs.onnx", **kw)
torch.onnx.export(View(False), x, f"{out}/view.onnx", **kw)
torch.onnx.export(View(True), x, f"{out}/view_dynamic.onnx", **kw)
torch.onnx.export(Reflect(), x, f"{out}/reflect.onnx", **kw)
torch.onnx.export(RawMatMul(), x, f"{out}/raw_matmul.onnx", **kw)
# An initializer of the wrong size: fc.weight cut to half its columns.
m = onnx.load(f"{out}/resnet18/model.onnx")
for t in m.graph.initializer:
    if t.name == "fc.weight":
        arr = onnx.numpy_helper.to_array(t)[:, :256].copy()
        t.CopyFrom(onnx.numpy_helper.from_array(arr, "fc.weight"))
onnx.save(m, f"{out}/wrong_size.onnx")
# A NaN weight (a broken export or a diverged PyTorch run): a NaN loss blamed on train.lr before.
m = onnx.load(f"{out}/resnet18/model.onnx")
for t in m.graph.initializer:
    if t.name == "layer1.0.conv1.weight":
        arr = onnx.numpy_helper.to_array(t).copy()
        arr.flat[7] = float("nan")
        t.CopyFrom(onnx.numpy_helper.from_array(arr, t.name))
onnx.save(m, f"{out}/nan_weight.onnx")
# A Conv with strides 0 (a hand-edited or converted file; the checker accepts it): it divided by
# zero (SIGFPE) in train, plan and inspect.
m = onnx.load(f"{out}/view.onnx")
for n in m.graph.node:
    for a in n.attribute:
        if n.op_type == "Conv" and a.name == "strides":
            a.ints[:] = [0, 0]
onnx.save(m, f"{out}/stride0.onnx")
PYEOF
CASE="an unsupported op"
expect_fail 2 "(LeakyRelu): op is not supported; dptrain runs Conv" -- \
  "$DPTRAIN" train --config "$D/run.toml" --set "model.onnx=$TMP/leaky.onnx"
CASE="x.view(-1, C*H*W): a Reshape to a constant shape trains"
expect_ok -- "$DPTRAIN" train --config "$D/run.toml" --set "model.onnx=$TMP/view.onnx" \
  --set "run_dir=$TMP/view_run"
CASE="x.view(x.size(0), -1): a shape computed in the graph"
expect_fail 2 "where the batch goes: the export fixed the batch size" -- \
  "$DPTRAIN" train --config "$D/run.toml" --set "model.onnx=$TMP/view_dynamic.onnx"
CASE="reflection padding"
expect_fail 2 "(Pad): mode=reflect is not supported (only constant zero padding)" -- \
  "$DPTRAIN" train --config "$D/run.toml" --set "model.onnx=$TMP/reflect.onnx"
CASE="x @ W with a raw parameter"
expect_fail 2 "(MatMul): only x @ W^T with W a weight in the file" -- \
  "$DPTRAIN" train --config "$D/run.toml" --set "model.onnx=$TMP/raw_matmul.onnx"
CASE="two inputs"
expect_fail 2 "two_inputs.onnx has 2 inputs" -- \
  "$DPTRAIN" train --config "$D/run.toml" --set "model.onnx=$TMP/two_inputs.onnx"
CASE="an initializer of the wrong size"
expect_fail 2 "initializer 'fc.weight' has 2560 values but the layer needs [10, 512]" -- \
  "$DPTRAIN" train --config "$D/run.toml" --set "model.onnx=$TMP/wrong_size.onnx"
CASE="a NaN in an initializer"
expect_fail 2 "initializer 'layer1.0.conv1.weight' holds NaN at index 7; the exported weights are not finite" -- \
  "$DPTRAIN" train --config "$D/run.toml" --set "model.onnx=$TMP/nan_weight.onnx"
CASE="a Conv with strides 0"
expect_fail 2 "(Conv): strides 0 is outside [1, 1048576]" -- \
  "$DPTRAIN" train --config "$D/run.toml" --set "model.onnx=$TMP/stride0.onnx"
CASE="model.classes that is not the output width"
expect_fail 2 "(model.onnx $D/model.onnx) does not match model.classes = 12" -- \
  "$DPTRAIN" train --config "$D/run.toml" --set model.classes=12
CASE="a file whose input is not the data's shape"
"$PY" -c "
import h5py, numpy as np
with h5py.File('$TMP/gray.h5', 'w') as f:
    f['images'] = np.zeros((16, 1, 32, 32), np.float32)
    f['labels'] = np.zeros(16, np.int32)
"
expect_fail 2 "takes samples of shape [3, 32, 32] but the data's samples are [1, 32, 32]" -- \
  "$DPTRAIN" train --config "$D/run.toml" --set "data.train=$TMP/gray.h5" --set "data.mean=[0]" \
  --set "data.std=[1]"
"$DPTRAIN" inspect "$TMP/leaky.onnx" >"$TMP/inspect_leaky.txt" 2>&1
check "inspect names the node dptrain cannot run" \
  grep -qF "/LeakyRelu (LeakyRelu): op is not supported" "$TMP/inspect_leaky.txt"
"$DPTRAIN" inspect "$TMP/stride0.onnx" >"$TMP/inspect_stride0.txt" 2>&1
check "inspect names a Conv with strides 0" \
  grep -qF "(Conv): strides 0 is outside [1, 1048576]" "$TMP/inspect_stride0.txt"
if two_ranks; then
  CASE="two ranks, an unsupported op: every rank stops"
  expect_fail 2 "op is not supported" -- \
    "${MPI2[@]}" "$DPTRAIN" train --config "$D/run.toml" --set "model.onnx=$TMP/leaky.onnx"
fi
finish
