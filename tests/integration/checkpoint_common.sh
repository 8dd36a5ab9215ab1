# SPDX-License-Identifier: Apache-2.0
# Shared by the checkpoint_*.sh end-to-end tests (sourced after lib.sh; not a test itself):
# a small deterministic Fashion-MNIST config, checkpoint comparisons through h5py, background
# runs that a test signals or kills, and directory snapshots ("nothing was overwritten").
# shellcheck shell=bash
# shellcheck disable=SC2034  # variables are read by the scripts that source this file
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

require_fmnist
if ! find_h5py_python; then
  echo "SKIP: no python3 with h5py and numpy (Debian: python3-h5py)"
  exit 77
fi

# ref_cnn on Fashion-MNIST, global batch 64 (937 steps per epoch: every stop is mid-epoch),
# deterministic. Checkpoints only where a test asks for them. Usage: CONFIG, then --set.
CONFIG=$TMP/ckpt.toml
cat >"$CONFIG" <<EOF
run_dir = "$TMP/unused"
seed = 5

[model]
name = "ref_cnn"
classes = 10

[data]
train = "$DPTRAIN_DATA/fmnist/train.h5"
test = "$DPTRAIN_DATA/fmnist/test.h5"
mean = [0.2860]
std = [0.3530]
workers = 1

[train]
epochs = 0
max_steps = 16
global_batch = 64
lr = 0.05
schedule = "cosine"
warmup_steps = 5
log_every_steps = 4
eval_every_epochs = 0
deterministic = true

[checkpoint]
every_steps = 0
every_epochs = 0
keep = 3
resume = "auto"
EOF

# Helpers in Python (h5py only, no dptrain code): compare and check checkpoint files.
CKPT_PY=$TMP/ckpt_tool.py
cat >"$CKPT_PY" <<'EOF'
import sys, zlib
import h5py, numpy as np

def tensors(path):
    out = {}
    with h5py.File(path, "r") as f:
        for group in ("params", "optimizer"):
            def visit(name, obj, group=group):
                if isinstance(obj, h5py.Dataset):
                    out[group + "/" + name] = obj[()]
            f[group].visititems(visit)
    return out

def same(a, b):
    """Exit 0 when every tensor of a and b is bitwise identical."""
    ta, tb = tensors(a), tensors(b)
    if ta.keys() != tb.keys():
        sys.exit(f"different tensor names: {sorted(ta.keys() ^ tb.keys())}")
    diff = [k for k in ta if ta[k].tobytes() != tb[k].tobytes()]
    print(f"{len(ta)} tensors, {len(diff)} differ" + (f" (first {diff[0]})" if diff else ""))
    sys.exit(1 if diff else 0)

def close(a, b, tol):
    """Exit 0 when every /params tensor agrees to a relative L2 difference <= tol."""
    ta, tb = tensors(a), tensors(b)
    worst, where = 0.0, "-"
    for k in ta:
        if not k.startswith("params/") or ta[k].dtype != np.float32:
            continue
        x, y = ta[k].astype(np.float64), tb[k].astype(np.float64)
        rel = np.linalg.norm(x - y) / max(np.linalg.norm(y), 1e-30)
        if rel > worst:
            worst, where = rel, k
    print(f"worst relative difference {worst:.3g} ({where})")
    sys.exit(0 if worst <= float(tol) else 1)

def valid(path):
    """Exit 0 when every tensor's crc32 attribute matches its bytes."""
    bad = []
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset) and "crc32" in obj.attrs:
                data = np.ascontiguousarray(obj[()]).tobytes()
                if zlib.crc32(data) != int(obj.attrs["crc32"]):
                    bad.append(name)
        f.visititems(visit)
        step = int(f["state"].attrs["step"])
    print(f"{path}: step {step}, " + (f"bad: {bad}" if bad else "every checksum matches"))
    sys.exit(1 if bad else 0)

def state(path, key):
    with h5py.File(path, "r") as f:
        print(f["state"].attrs[key])

def flip(path, tensor, at):
    """Flips one bit of byte `at` of a (contiguous) tensor's data in the file."""
    with h5py.File(path, "r") as f:
        offset = f[tensor].id.get_offset()
    with open(path, "r+b") as f:
        f.seek(offset + int(at))
        b = f.read(1)
        f.seek(offset + int(at))
        f.write(bytes([b[0] ^ 0x04]))

def delete(path, tensor):
    with h5py.File(path, "r+") as f:
        del f[tensor]

def state_lines(attrs):
    """docs/checkpoints.md's state_crc32 text: what /state@crc32 is the CRC-32 of."""
    def text(v):
        if isinstance(v, bytes):
            return v.decode()
        if isinstance(v, str):
            return v
        if isinstance(v, (float, np.floating)):
            return "nan" if np.isnan(v) else "%.17g" % v
        return str(int(v))
    return "".join(f"{k}={text(attrs[k])}\n" for k in sorted(attrs) if k != "crc32")

def set_state(path, key, value, fix="keep"):
    """Rewrites /state@key (a float) by hand; fix=fix recomputes /state@crc32 the way
    docs/checkpoints.md says, as a user who edits the position on purpose would."""
    with h5py.File(path, "r+") as f:
        s = f["state"].attrs
        s[key] = np.float64(value)
        if fix == "fix":
            lines = state_lines(s)
            s["crc32"] = np.uint32(zlib.crc32(lines.encode()))

def prefix(path, pre):
    """Renames every tensor of /params and /optimizer to pre + name (a DDP-wrapped export)."""
    with h5py.File(path, "r+") as f:
        for group in ("params", "optimizer"):
            for name in list(f[group].keys()):
                f[group].move(name, pre + name)

if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
EOF
ckpt_py() { "$PY" "$CKPT_PY" "$@"; }

# ckpt DIR STEP: the checkpoint file name of STEP in run dir DIR.
ckpt() { printf '%s/checkpoints/ckpt-%08d.h5' "$1" "$2"; }

# snapshot DIR: one line per file below DIR (name and md5), to prove nothing changed.
snapshot() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 -r md5sum); }

# bg_start NAME command...: runs the command in the background with stdout/stderr in
# $TMP/NAME.{out,err}; BG_PID is its PID.
bg_start() {
  local name=$1
  shift
  "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" </dev/null &
  BG_PID=$!
}

# wait_for FILE PATTERN [SECONDS]: waits until FILE holds the fixed string PATTERN.
wait_for() {
  local file=$1 pattern=$2 limit=${3:-30} i
  for ((i = 0; i < limit * 10; i++)); do
    grep -qF -- "$pattern" "$file" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "  (timed out after ${limit}s waiting for '$pattern' in $file)"
  return 1
}

# bg_wait [SECONDS]: waits for BG_PID (killing it after SECONDS); BG_RC is its exit code.
bg_wait() {
  local limit=${1:-60} i
  for ((i = 0; i < limit * 10; i++)); do
    kill -0 "$BG_PID" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$BG_PID" 2>/dev/null; then
    echo "  (still running after ${limit}s: killing $BG_PID)"
    kill -9 "$BG_PID" 2>/dev/null
  fi
  BG_RC=0
  wait "$BG_PID" || BG_RC=$?
}
