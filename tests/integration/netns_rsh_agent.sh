#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Stand-in for ssh as Open MPI's launcher agent in two_hosts.sh:
#   mpirun --mca plm_rsh_agent tests/integration/netns_rsh_agent.sh ...
# Open MPI calls it like ssh: AGENT [ssh options] HOST "remote command string". Instead of
# logging in, it enters the network namespace "$NETNS_PREFIX$HOST" and, in a fresh UTS
# namespace, sets the hostname to HOST, so each fake host has its own network stack AND its own
# hostname (Open MPI tells nodes apart by hostname; with one shared hostname it would treat both
# namespaces as one node and its shared-memory transport would fail across them).
# NETNS_AGENT_LOG, when set, gets one line per call.
set -eu
prefix=${NETNS_PREFIX:?NETNS_PREFIX is not set}
# ssh-style options (-x, -o X, -l user, ...) may precede the host: skip them.
while [ $# -gt 0 ]; do
  case "$1" in
    -o | -l | -p | -i) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
host=$1
shift
[ -n "${NETNS_AGENT_LOG:-}" ] && echo "agent: host=$host cmd=$*" >>"$NETNS_AGENT_LOG"
# `ip netns exec` also bind-mounts /etc/netns/NS/hosts over /etc/hosts.
exec ip netns exec "$prefix$host" unshare --uts /bin/sh -c 'hostname "$1"; shift; eval "$*"' sh "$host" "$*"
