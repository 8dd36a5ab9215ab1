#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The floors check (DESIGN.md section 2): includes point to the same floor or down, never up, and
# never into another folder's private header. Floors, bottom to top: core -> models, datasets ->
# runtime -> launcher. Fails, naming file:line and the include, when
#   core/     includes models/ datasets/ runtime/ launcher/
#   models/   includes datasets/ runtime/ launcher/
#   datasets/ includes models/ runtime/ launcher/
#   runtime/  includes launcher/
#   any file includes a header private to a folder it is not in: core/cuda/cuda_backend_impl.h
#     (outside core/cuda/), launcher/config_schema.h (outside launcher/), and every header whose
#     first 5 lines contain the word "private" or "INTERNAL" (outside that header's folder).
# Scans the git-tracked .h/.cc/.cu/.cuh files (all such files under the source tree when it is
# not a git checkout). ctest runs it as lint.floors.
#   scripts/check-floors.sh [SOURCE_DIR]   (default: the repository this script is in)
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files -- '*.h' '*.cc' '*.cu' '*.cuh')
else
  mapfile -t files < <(find . -path ./build\* -prune -o -type f \
    \( -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' \) -print | sed 's|^\./||' | sort)
fi

# Private headers: path -> the folder whose files alone may include it.
declare -A private=([core/cuda/cuda_backend_impl.h]=core/cuda [launcher/config_schema.h]=launcher)
for f in "${files[@]}"; do
  case "$f" in *.h | *.cuh) ;; *) continue ;; esac
  if head -n 5 "$f" | grep -qwE 'private|INTERNAL'; then
    dir=$(dirname "$f")
    private[$f]=$dir
  fi
done

violations=0
report() {
  echo "$1: $2" >&2
  violations=$((violations + 1))
}

include_re='^[[:space:]]*#[[:space:]]*include[[:space:]]*["<]([^">]+)[">]'
for f in "${files[@]}"; do
  [ -f "$f" ] || continue  # deleted in the work tree but still in the index
  floor=${f%%/*}
  case "$floor" in
    core) up='models|datasets|runtime|launcher' ;;
    models) up='datasets|runtime|launcher' ;;
    datasets) up='models|runtime|launcher' ;;
    runtime) up='launcher' ;;
    *) up='' ;;
  esac
  while IFS= read -r hit; do
    line=${hit%%:*}
    text=${hit#*:}
    [[ $text =~ $include_re ]] || continue
    inc=${BASH_REMATCH[1]}
    if [ -n "$up" ] && [[ ${inc%%/*} =~ ^($up)$ ]]; then
      report "$f:$line" "$floor/ includes $inc: $floor/ may not see ${inc%%/*}/ (floors, bottom to top: core -> models, datasets -> runtime -> launcher)"
    fi
    owner=${private[$inc]:-}
    if [ -n "$owner" ] && [[ $f != "$owner"/* ]]; then
      report "$f:$line" "includes $inc, private to $owner/"
    fi
  done < <(grep -nE '^[[:space:]]*#[[:space:]]*include' "$f" || true)
done

if [ "$violations" -gt 0 ]; then
  echo "check-floors: $violations violation(s) (DESIGN.md section 2: includes point to the same" \
    "floor or down, never into another folder's private header)" >&2
  exit 1
fi
echo "check-floors: ${#files[@]} files, ${#private[@]} private headers, no violations"
