#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Static analysis of dptrain's own sources: clang-tidy (.clang-tidy at the repository root) and
# cppcheck, both driven by the compile_commands.json of a configure-only build (no compiling).
# Checked: every .cc under core/ models/ datasets/ runtime/ launcher/ in that database (with the
# CUDA toolkit present that includes the CUDA backend's and the NCCL communicator's C++ sources,
# with the CUDA include path the build uses), and the headers they include from those folders. Not checked: tests/, bench/, third-party headers, and .cu files (clang-tidy does
# not parse them with nvcc's flags). Exit 1 on any finding.
#   scripts/lint.sh [BUILD_DIR]   (default build-tidy; JOBS=n parallel clang-tidy processes;
#                                  LINT_CUDA=AUTO|ON|OFF, default AUTO: CUDA sources when found)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-tidy}
jobs=${JOBS:-$(nproc)}
root=$PWD

for tool in clang++ clang-tidy cppcheck; do
  command -v "$tool" >/dev/null || { echo "lint: $tool not found (scripts/install-deps.sh)" >&2; exit 2; }
done

# Configure with clang so that every flag in the database is one clang-tidy understands. CUDA
# as the build finds it (AUTO): the CUDA backend's .cc files are C++ compiled by the host
# compiler against the toolkit's headers, so they belong in the database like any other source.
CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DDPTRAIN_WITH_CUDA="${LINT_CUDA:-AUTO}" -DDPTRAIN_BUILD_TESTS=OFF -DDPTRAIN_BUILD_BENCH=OFF \
  >/dev/null

# The product sources only: a filtered copy of the database.
mkdir -p "$build/lint"
/usr/bin/python3 - "$build/compile_commands.json" "$build/lint/compile_commands.json" "$root" <<'PY'
import json, os, sys
src, dst, root = sys.argv[1:]
keep = [e for e in json.load(open(src))
        if os.path.relpath(e["file"], root).split(os.sep)[0] in
        ("core", "launcher", "runtime", "models", "datasets") and e["file"].endswith(".cc")]
json.dump(keep, open(dst, "w"), indent=1)
print("\n".join(sorted(os.path.relpath(e["file"], root) for e in keep)),
      file=open(os.path.join(os.path.dirname(dst), "files.txt"), "w"))
PY
mapfile -t files < "$build/lint/files.txt"
echo "lint: ${#files[@]} source files"
if ! printf '%s\n' "${files[@]}" | grep -q '^core/cuda/'; then
  echo "lint: CUDA sources not checked (configured without CUDA; LINT_CUDA=ON to insist)"
fi

status=0
start=$(date +%s)
echo "lint: clang-tidy ($(clang-tidy --version | grep -o 'version [0-9.]*'), $jobs jobs)"
# One process per file; output collected per file so that parallel runs do not interleave.
rm -rf "$build/lint/tidy" && mkdir -p "$build/lint/tidy"
printf '%s\n' "${files[@]}" | xargs -P "$jobs" -I{} sh -c \
  'out="$2/lint/tidy/$(echo "$1" | tr / _).txt"
   clang-tidy -p "$2/lint" --quiet "$1" >"$out" 2>&1 || echo "$1" >>"$out.failed"' _ {} "$build"
for f in "$build"/lint/tidy/*.txt; do
  grep -v -E '^[0-9]+ warnings? generated\.$|^Suppressed [0-9]+ warnings|^Use -header-filter|^$' \
    "$f" || true
done
if compgen -G "$build/lint/tidy/*.failed" >/dev/null; then
  echo "lint: clang-tidy findings in: $(cat "$build"/lint/tidy/*.failed | tr '\n' ' ')"
  status=1
fi
echo "lint: clang-tidy took $(( $(date +%s) - start ))s"

start=$(date +%s)
echo "lint: cppcheck ($(cppcheck --version))"
mkdir -p "$build/lint/cppcheck"  # its cache of per-file results
# Findings in third-party headers (/usr) are not ours; everything else fails the run.
# --inline-suppr honours `// cppcheck-suppress id` comments (each must say why).
# Two checks are off: DPT_THROW / DPT_CHECK_AS expand to `Raise() & ErrorStream<Type>(...) << a`,
# whose template angle brackets cppcheck 2.10 misparses, so it reports every value streamed into
# an error message as unused (ignoredReturnValue) and every function that ends in DPT_THROW as
# missing a return (missingReturn). The compiler covers both: -Wreturn-type (-Wall) and
# [[nodiscard]] under -Werror in `make build`.
if ! cppcheck --project="$build/lint/compile_commands.json" -j "$jobs" --quiet \
    --enable=warning,performance,portability --inline-suppr --error-exitcode=1 \
    --std=c++20 --library=posix --suppress='*:/usr/*' \
    --suppress=ignoredReturnValue --suppress=missingReturn \
    --cppcheck-build-dir="$build/lint/cppcheck" --template='{file}:{line}: {severity}: {message} [{id}]'; then
  status=1
fi
echo "lint: cppcheck took $(( $(date +%s) - start ))s"
[ $status = 0 ] && echo "lint: clean" || echo "lint: FAILED"
exit $status
