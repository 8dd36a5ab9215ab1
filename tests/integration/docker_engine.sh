#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A Docker engine for the container test, started by hand (no systemd): Debian's docker.io
# (dockerd + its own containerd + runc) as root, everything under one directory, the API on a
# unix socket there, no networking of Docker's own (--bridge=none, no iptables: no docker0 is
# ever created; containers get lo only, or the host's network with --network=host, as the
# Dockerfile's apt-get needs during `docker build`). Also makes the Debian base image with
# debootstrap, since no container registry is reachable from CI.
#
#   docker_engine.sh up DIR [DATA] start dockerd under DIR (PID in DIR/dockerd.daemon-pid);
#                                  prints nothing else on success; then DOCKER_HOST=unix://DIR/docker.sock.
#                                  Images, layers and build cache go to DATA (default DIR/data):
#                                  a DATA outside DIR outlives the engine, so the next engine
#                                  started on it reuses its layers and BuildKit cache mounts
#   docker_engine.sh down DIR [DATA]  remove containers, stop dockerd by its recorded PID (TERM,
#                                  20 s, then KILL), unmount what it left under DIR (and DATA),
#                                  remove DIR (DATA is kept)
#   docker_engine.sh base TARBALL  debootstrap a minimal rootfs of this host's Debian release
#                                  into TARBALL (.tar.zst) unless it exists; `docker import` it
# Every wait is bounded. Never kills anything it did not start.
set -euo pipefail

die() {
  echo "docker_engine: $*" >&2
  exit 1
}

daemon_alive() {  # DIR: the recorded dockerd is alive and still dockerd
  local pid
  [[ -f $1/dockerd.daemon-pid ]] || return 1
  pid=$(cat "$1/dockerd.daemon-pid")
  [[ -r /proc/$pid/cmdline ]] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q '^dockerd '
}

cmd_up() {
  local d=$1 data=${2:-$1/data} i
  command -v dockerd >/dev/null || die "dockerd is missing (scripts/install-deps.sh --cluster-tests)"
  daemon_alive "$d" && die "a dockerd started from $d is still running (docker_engine.sh down $d)"
  mkdir -p "$d" "$data"
  # setsid (no job control) execs in place: $! is dockerd's own PID; it starts containerd as a
  # child and stops it when it exits.
  setsid dockerd --data-root "$data" --exec-root "$d/exec" --pidfile "$d/dockerd.pid" \
    -H "unix://$d/docker.sock" --bridge=none --iptables=false --ip6tables=false \
    --ip-masq=false --storage-driver=overlay2 </dev/null >"$d/dockerd.log" 2>&1 &
  echo $! >"$d/dockerd.daemon-pid"
  for ((i = 0; i < 300; i++)); do  # 60 s
    DOCKER_HOST=unix://$d/docker.sock docker version >/dev/null 2>&1 && return 0
    daemon_alive "$d" || { tail -n 20 "$d/dockerd.log" >&2; die "dockerd exited during start"; }
    sleep 0.2
  done
  tail -n 20 "$d/dockerd.log" >&2
  die "dockerd did not answer within 60 s"
}

cmd_down() {
  local d=$1 data=${2:-$1/data} pid i rc=0
  if daemon_alive "$d"; then
    pid=$(cat "$d/dockerd.daemon-pid")
    export DOCKER_HOST=unix://$d/docker.sock
    timeout 60 docker ps -aq 2>/dev/null | xargs -r timeout 60 docker rm -f >/dev/null 2>&1 || true
    kill -TERM "$pid"
    for ((i = 0; i < 200; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      echo "docker_engine: dockerd ($pid) ignored TERM for 20 s, killing it" >&2
      kill -KILL "$pid"
      rc=1
    fi
  fi
  rm -f "$d/dockerd.daemon-pid"
  # dockerd leaves an nsfs mount (exec/netns/default) and, if killed, overlay mounts.
  awk -v r="$d/" -v s="$data/" 'index($2, r) == 1 || index($2, s) == 1 { print $2 }' /proc/mounts |
    sort -r | xargs -r -n1 umount -l
  rm -rf "$d"
  return $rc
}

cmd_base() {
  local out=$1 root codename mirror
  if [[ ! -s $out ]]; then
    command -v debootstrap >/dev/null || die "debootstrap is missing (scripts/install-deps.sh --cluster-tests)"
    command -v zstd >/dev/null || die "zstd is missing (scripts/install-deps.sh --cluster-tests)"
    # shellcheck disable=SC1091
    codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
    mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
    mkdir -p "$(dirname "$out")"
    root=$(mktemp -d "$(dirname "$out")/rootfs.XXXXXX")
    # shellcheck disable=SC2064  # expand now: the path is fixed
    trap "rm -rf '$root'" EXIT
    timeout 900 debootstrap --variant=minbase "$codename" "$root" "$mirror" >"$out.log" 2>&1 ||
      { tail -n 20 "$out.log" >&2; die "debootstrap $codename failed (log: $out.log)"; }
    # The release, its updates and its security fixes, like a Debian image from a registry.
    rm -f "$root/etc/apt/sources.list"
    cat >"$root/etc/apt/sources.list.d/debian.sources" <<SRC
Types: deb
URIs: $mirror
Suites: $codename $codename-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${mirror%/debian}/debian-security
Suites: $codename-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    # Write under a temporary name: an interrupted run never leaves a torn cache entry.
    tar -C "$root" --numeric-owner -c . | zstd -q -T0 -o "$out.tmp"
    mv -f "$out.tmp" "$out"
    rm -rf "$root"
    trap - EXIT
  fi
}

case "${1:-}" in
  up) cmd_up "${2:?DIR}" "${3:-}" ;;
  down) cmd_down "${2:?DIR}" "${3:-}" ;;
  base) cmd_base "${2:?TARBALL}" ;;
  *) die "usage: $0 up DIR [DATA] | down DIR [DATA] | base TARBALL" ;;
esac
