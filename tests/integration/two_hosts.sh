#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Two hosts for real: 2 ranks on each of two "hosts" that are network namespaces of this machine
# joined by a veth pair (10.77.0.1 <-> 10.77.0.2, addresses that exist only inside the namespaces
# this script creates and deletes). mpirun starts in the first host with a hostfile and an rsh
# agent (tests/integration/netns_rsh_agent.sh) instead of ssh; ranks on different hosts talk TCP
# over the veth link, ranks on the same host use shared memory. Checks:
#   - a short Fashion-MNIST run exits 0 and its training loss and final evaluation equal those
#     of the same run as 4 ranks on one host (relative 1e-5), and so do the final parameters
#     when both runs wrote checkpoints;
#   - local rank and threads are per host: the rank table shows local ranks 0/2 and 1/2 on each
#     of the two hosts;
#   - traffic really crossed the veth link, and no process is left in either namespace.
# Skipped (exit 77) without root / CAP_NET_ADMIN (ip netns add fails) or without the data.
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
require_fmnist
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

P="dptit$$-"       # namespace prefix: unique per run (the agent reads it from NETNS_PREFIX)
H1=dpthost1 H2=dpthost2
NET=10.77.0        # a /24 that exists only inside the two namespaces
V1="dpt$$a" V2="dpt$$b"

teardown() {  # deleting a namespace also deletes its end of the veth pair
  local n
  for n in $H1 $H2; do
    ip netns del "$P$n" 2>/dev/null
    rm -rf "/etc/netns/$P$n"
  done
  cleanup
}

if ! command -v ip >/dev/null || ! command -v unshare >/dev/null; then
  echo "SKIP: ip (iproute2) and unshare (util-linux) are needed: scripts/install-deps.sh --cluster-tests"
  exit 77
fi
if ! ip netns add "${P}$H1" 2>"$TMP/netns.err"; then
  echo "SKIP: cannot create a network namespace (needs root / CAP_NET_ADMIN): $(cat "$TMP/netns.err")"
  exit 77
fi
trap teardown EXIT
ip netns add "${P}$H2"
ip link add "$V1" netns "${P}$H1" type veth peer name "$V2" netns "${P}$H2"
ip -n "${P}$H1" addr add "$NET.1/24" dev "$V1"
ip -n "${P}$H2" addr add "$NET.2/24" dev "$V2"
for n in $H1 $H2; do
  v=$V1
  [[ $n == "$H2" ]] && v=$V2
  ip -n "$P$n" link set lo up  # the Open MPI daemons also talk to themselves over 127.0.0.1
  ip -n "$P$n" link set "$v" up
  mkdir -p "/etc/netns/$P$n"  # `ip netns exec` bind-mounts this hosts file over /etc/hosts
  printf '127.0.0.1 localhost\n%s.1 %s\n%s.2 %s\n' $NET $H1 $NET $H2 >"/etc/netns/$P$n/hosts"
done
printf '%s slots=2\n%s slots=2\n' $H1 $H2 >"$TMP/hostfile"

cd "$DPTRAIN_SRC" || exit 1
common=(train --config configs/fmnist_cnn.toml --set train.max_steps=30
  --set train.log_every_steps=10 --set checkpoint.every_epochs=0
  --set "data.train=$DPTRAIN_DATA/fmnist/train.h5" --set "data.test=$DPTRAIN_DATA/fmnist/test.h5")

# The reference: 4 ranks on this one host.
t=$SECONDS
rc=0
timeout -k 10 300 "${MPI4[@]}" "$DPTRAIN" "${common[@]}" --set "run_dir=$TMP/one" \
  >"$TMP/one.out" 2>"$TMP/one.err" </dev/null || rc=$?
if [[ $rc == 0 ]]; then
  pass "one host, 4 ranks: exit 0 ($((SECONDS - t))s)"
else
  fail "one host, 4 ranks: exit $rc"
  tail -n 20 "$TMP/one.err"
fi

# Two hosts x 2 ranks. Open MPI's own traffic and the TCP BTL go over the veth subnet only.
export NETNS_PREFIX=$P NETNS_AGENT_LOG=$TMP/agent.log
export OMPI_MCA_oob_tcp_if_include=$NET.0/24 OMPI_MCA_btl_tcp_if_include=$NET.0/24
t=$SECONDS
rc=0
timeout -k 10 300 ip netns exec "$P$H1" unshare --uts /bin/sh -c 'hostname "$1"; shift; exec "$@"' \
  sh $H1 "$MPIEXEC" -np 4 --hostfile "$TMP/hostfile" --bind-to none \
  --mca plm_rsh_agent "$here/netns_rsh_agent.sh" --mca plm_rsh_no_tree_spawn 1 \
  --mca pml ob1 --mca btl self,vader,tcp \
  "$DPTRAIN" "${common[@]}" --set "run_dir=$TMP/two" \
  >"$TMP/two.out" 2>"$TMP/two.err" </dev/null || rc=$?
cat "$TMP/two.out"
if [[ $rc == 0 ]]; then
  pass "two hosts x 2 ranks (mpirun in $H1, rsh agent to $H2, TCP over veth): exit 0 ($((SECONDS - t))s)"
else
  fail "two hosts x 2 ranks: exit $rc"
  tail -n 30 "$TMP/two.err"
fi

check "the agent started the remote daemon on $H2 (and only there)" \
  bash -c "grep -q 'host=$H2 ' '$TMP/agent.log' && ! grep -q 'host=$H1 ' '$TMP/agent.log'"
row() {  # rank host local: the rank table has that row
  grep -qE "^$1 +$2 +$3 " "$TMP/two.out"
}
check "rank table: ranks 0,1 on $H1 with local ranks 0/2, 1/2" \
  bash -c "$(declare -f row); TMP='$TMP'; row 0 $H1 0/2 && row 1 $H1 1/2"
check "rank table: ranks 2,3 on $H2 with local ranks 0/2, 1/2" \
  bash -c "$(declare -f row); TMP='$TMP'; row 2 $H2 0/2 && row 3 $H2 1/2"
# Threads per rank = cores / ranks on the host (2 per host here), not / world size (4).
cores=$(nproc)
want=$((cores / 2 > 0 ? cores / 2 : 1))
check "threads per rank are per host: $want on each row ($cores cores / 2 local ranks)" \
  bash -c "[[ \$(awk '/^[0-3] +dpthost/ { print \$5 }' '$TMP/two.out' | sort -u) == $want ]]"
bytes=$(ip -n "$P$H1" -s link show "$V1" | awk '/TX:/ { getline; print $1; exit }')
check "rank traffic crossed the veth link ($bytes bytes sent by $H1)" test "${bytes:-0}" -gt 1000000
left=$(ip netns pids "$P$H1"; ip netns pids "$P$H2")
check "no process left in the namespaces${left:+: $left}" test -z "$left"

check "two hosts match one host: training loss and final evaluation to relative 1e-5" \
  python3 - "$TMP/one/metrics.jsonl" "$TMP/two/metrics.jsonl" <<'PY'
import json, sys
def load(p):
    lines = [json.loads(l) for l in open(p)]
    steps = {j["step"]: j["loss"] for j in lines if j.get("kind") == "step"}
    evals = [j for j in lines if j.get("kind") == "eval"]
    return steps, evals
(s1, e1), (s2, e2) = load(sys.argv[1]), load(sys.argv[2])
assert s1 and sorted(s1) == sorted(s2), (sorted(s1), sorted(s2))
assert e1 and len(e1) == len(e2), (e1, e2)
def close(a, b):
    return abs(a - b) <= 1e-5 * max(abs(a), abs(b), 1e-12)
for k in s1:
    assert close(s1[k], s2[k]), f"step {k}: loss {s1[k]} vs {s2[k]}"
for a, b in zip(e1, e2):
    for key in ("test_loss", "test_accuracy"):
        assert close(a[key], b[key]), f"eval {key}: {a[key]} vs {b[key]}"
print(f"losses at steps {sorted(s1)} and evals {[(e['test_loss'], e['test_accuracy']) for e in e1]} match")
PY

# Final parameters, when the runs write checkpoints (run_dir/checkpoints/ckpt-*.h5).
c1=$(ls "$TMP"/one/checkpoints/ckpt-*.h5 2>/dev/null | tail -n 1)
c2=$(ls "$TMP"/two/checkpoints/ckpt-*.h5 2>/dev/null | tail -n 1)
if [[ -n $c1 && -n $c2 ]] && find_h5py_python; then
  check "final parameters (last checkpoints) match to relative 1e-5" \
    "$PY" - "$c1" "$c2" <<'PY'
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
names = sorted(a["params"])
assert names == sorted(b["params"]), (names, sorted(b["params"]))
worst = 0.0
for n in names:
    x, y = np.asarray(a["params"][n], np.float64), np.asarray(b["params"][n], np.float64)
    d = float(np.max(np.abs(x - y) / np.maximum(np.maximum(np.abs(x), np.abs(y)), 1e-6))) if x.size else 0.0
    worst = max(worst, d)
assert worst <= 1e-5, f"largest relative difference {worst}"
print(f"{len(names)} tensors, largest relative difference {worst:.3g}")
PY
else
  echo "note: no checkpoints from both runs (or no h5py): parameters not compared"
fi

finish
