#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The Dockerfile for real: starts a Docker engine (Debian's docker.io) by hand, makes a Debian base
# image with debootstrap (no registry is reachable; cached as a tarball, see below), builds the
# project's multi-stage Dockerfile with BASE_IMAGE/RUNTIME_IMAGE pointing at that base, checks the
# image (entrypoint dptrain, Open MPI container settings, no compiler in the runtime stage), and
# runs `mpirun -np 2 dptrain train` inside it on Fashion-MNIST mounted read-only from the host:
# exit 0, metrics.jsonl written to a mounted run directory, and no CMA "errno = 1" warnings.
#
# Environment:
#   DPTRAIN_DOCKER_BASE_CACHE  where the debootstrap base tarball is kept between runs
#                              (default /var/cache/dptrain-docker-base; delete it to start over)
#   DPTRAIN_DOCKER_DATA_ROOT   the engine's images, layers and build cache, kept between runs
#                              (default /var/cache/dptrain-docker-engine; "none": a fresh engine
#                              each run). A run whose Dockerfile layers and sources are unchanged
#                              up to a point reuses them; the build stage's compiler cache (a
#                              BuildKit cache mount) makes the compile after a source change
#                              incremental. One run uses it at a time (flock; a run that waits
#                              more than 10 minutes falls back to a fresh engine). The image a
#                              run builds is removed at its end; build cache past 8 GB is pruned.
#   DPTRAIN_DOCKER_JOBS        compile jobs inside `docker build` (default: nproc)
# Skipped (exit 77) without root, without the converted data, or without docker.io/debootstrap
# (scripts/install-deps.sh --cluster-tests installs them; `make test` does).
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
require_fmnist

if [[ $(id -u) != 0 ]]; then
  echo "SKIP: starting a Docker engine needs root"
  exit 77
fi
for tool in dockerd docker debootstrap zstd; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIP: $tool is missing (scripts/install-deps.sh --cluster-tests installs it)"
    exit 77
  fi
done

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# Debian's client matches Debian's engine (a newer client in /usr/local/bin also works but
# prints a legacy-builder deprecation notice).
DOCKER=docker
[[ -x /usr/bin/docker ]] && DOCKER=/usr/bin/docker
ENGINE=$TMP/engine
export DOCKER_HOST=unix://$ENGINE/docker.sock
CACHE=${DPTRAIN_DOCKER_BASE_CACHE:-/var/cache/dptrain-docker-base}
# shellcheck disable=SC1091
CODENAME=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
BASE_TAR=$CACHE/debian-$CODENAME-minbase.tar.zst
BASE_TAG=localhost/debian:$CODENAME-minbase
IMAGE=localhost/dptrain:it-$$
DATA_ROOT=${DPTRAIN_DOCKER_DATA_ROOT:-/var/cache/dptrain-docker-engine}
if [[ $DATA_ROOT == none ]]; then
  DATA_ROOT=$ENGINE/data
else
  mkdir -p "$(dirname "$DATA_ROOT")"
  exec 9>"$DATA_ROOT.lock"
  if ! flock -w 600 9; then
    echo "docker: $DATA_ROOT is in use by another run for 10 minutes; using a fresh engine"
    DATA_ROOT=$ENGINE/data
  fi
fi
# BuildKit: the Dockerfile's RUN --mount (Debian's 20.10 client has it built in).
export DOCKER_BUILDKIT=1

stop_engine() {
  local t=$SECONDS
  if [[ $DATA_ROOT != "$ENGINE/data" ]]; then
    timeout 60 $DOCKER rmi -f "$IMAGE" >/dev/null 2>&1 || true
    timeout 120 $DOCKER image prune -f >/dev/null 2>&1 || true
    timeout 120 $DOCKER builder prune -f --keep-storage 8GB >/dev/null 2>&1 || true
  fi
  bash "$here/docker_engine.sh" down "$ENGINE" "$DATA_ROOT" || true
  echo "docker engine stopped and removed ($((SECONDS - t))s)"
  cleanup
}
trap stop_engine EXIT

elapsed() { echo $((SECONDS - $1)); }

t=$SECONDS
if ! bash "$here/docker_engine.sh" up "$ENGINE" "$DATA_ROOT"; then
  fail "start dockerd"
  finish
fi
pass "dockerd started ($(elapsed $t)s): $($DOCKER version --format 'engine {{.Server.Version}}'), data root $DATA_ROOT"

t=$SECONDS
cached=no
[[ -s $BASE_TAR ]] && cached=yes
# The tag names the tarball's checksum and is imported once per engine data root: an import
# makes a new image ID every time, and a new base would miss every cached layer built on it.
import_base() {
  BASE_TAG=$BASE_TAG-$(sha256sum "$BASE_TAR" | cut -c1-12)
  $DOCKER image inspect "$BASE_TAG" >/dev/null 2>&1 && return 0
  zstd -dc "$BASE_TAR" | timeout 300 $DOCKER import - "$BASE_TAG" >/dev/null
}
if bash "$here/docker_engine.sh" base "$BASE_TAR" && import_base; then
  pass "base image $BASE_TAG from debootstrap (cached: $cached, $(elapsed $t)s)"
else
  fail "base image from debootstrap"
  finish
fi

# The real multi-stage build, both stages on the Debian base (the CUDA images need a registry).
t=$SECONDS
if timeout -k 10 3000 $DOCKER build --network=host --pull=false --progress=plain \
  --build-arg "BASE_IMAGE=$BASE_TAG" --build-arg "RUNTIME_IMAGE=$BASE_TAG" \
  --build-arg "JOBS=${DPTRAIN_DOCKER_JOBS:-$(nproc)}" \
  -t "$IMAGE" "$DPTRAIN_SRC" >"$TMP/build.log" 2>&1; then
  pass "docker build of the Dockerfile ($(elapsed $t)s)"
else
  fail "docker build of the Dockerfile (exit after $(elapsed $t)s)"
  tail -n 40 "$TMP/build.log"
  finish
fi
echo "image: $($DOCKER image inspect --format '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}')"

CASE="the image's entrypoint is dptrain"
check "$CASE" test "$($DOCKER image inspect --format '{{json .Config.Entrypoint}}' "$IMAGE")" = '["dptrain"]'
env_of_image=$($DOCKER image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "$IMAGE")
check "the image sets OMPI_MCA_btl_vader_single_copy_mechanism=none" \
  grep -qx 'OMPI_MCA_btl_vader_single_copy_mechanism=none' <<<"$env_of_image"
check "the image allows mpirun as root" grep -qx 'OMPI_ALLOW_RUN_AS_ROOT=1' <<<"$env_of_image"

CASE="docker run IMAGE --version (entrypoint runs dptrain)"
expect_ok -- timeout 60 $DOCKER run --rm --network=none "$IMAGE" --version
check "  and prints dptrain's version" grep -qE '^[0-9]+\.[0-9]+\.[0-9]+' "$TMP/last.out"

CASE="docker run IMAGE info"
expect_ok -- timeout 60 $DOCKER run --rm --network=none "$IMAGE" info
cat "$TMP/last.out"

check "the runtime stage is slim (no compiler, no cmake, no headers)" \
  timeout 60 $DOCKER run --rm --network=none --entrypoint sh "$IMAGE" -c \
  '! command -v c++ && ! command -v cmake && ! test -e /usr/include/mpi.h && ! test -d /src'

# mpirun -np 2 dptrain train inside the container: data read-only from the host, outputs in a
# mounted directory. --oversubscribe/--bind-to none/yield: 2 ranks on a small shared CI machine.
mkdir -p "$TMP/run"
t=$SECONDS
rc=0
timeout -k 10 600 $DOCKER run --rm --network=none --name "dptrain-it-$$" \
  -v "$DPTRAIN_DATA/fmnist:/data/fmnist:ro" -v "$TMP/run:/runs" \
  -e OMP_WAIT_POLICY=passive \
  --entrypoint mpirun "$IMAGE" -np 2 --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 \
  dptrain train --config /opt/dptrain/configs/fmnist_cnn.toml \
  --set run_dir=/runs/fmnist --set train.max_steps=20 --set train.log_every_steps=10 \
  --set data.train=/data/fmnist/train.h5 --set data.test=/data/fmnist/test.h5 \
  >"$TMP/train.out" 2>"$TMP/train.err" </dev/null || rc=$?
cat "$TMP/train.out"
if [[ $rc == 0 ]]; then
  pass "mpirun -np 2 dptrain train inside the container exits 0 ($(elapsed $t)s)"
else
  fail "mpirun -np 2 dptrain train inside the container exited $rc after $(elapsed $t)s"
  tail -n 30 "$TMP/train.err"
  timeout 30 $DOCKER rm -f "dptrain-it-$$" >/dev/null 2>&1
fi
check "the rank table lists ranks 0/2 and 1/2" \
  bash -c "grep -qE '^0 +[^ ]+ +0/2 ' '$TMP/train.out' && grep -qE '^1 +[^ ]+ +1/2 ' '$TMP/train.out'"
check "no CMA single-copy warnings (errno = 1) from Open MPI" \
  bash -c "! grep -q 'errno = 1' '$TMP/train.out' '$TMP/train.err'"
check "metrics.jsonl in the mounted run_dir reaches step 20" \
  python3 - "$TMP/run/fmnist/metrics.jsonl" <<'PY'
import json, math, sys
steps = [j for j in map(json.loads, open(sys.argv[1])) if j.get("kind") == "step"]
assert steps and steps[-1]["step"] == 20, steps[-1:] or "no step line"
assert all(math.isfinite(j["loss"]) for j in steps)
print(f"last step line: {steps[-1]}")
PY

finish
