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
  -DDPTRAIN_CCACHE=OFF \
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
tidy_version=$(clang-tidy --version | grep -o 'version [0-9.]*')
echo "lint: clang-tidy ($tidy_version, $jobs jobs)"
# Clean results are cached outside the clone (LINT_CACHE, default ~/.cache/dptrain-lint; LINT_CACHE=off
# disables it): a file is skipped when clang-tidy already found nothing in exactly the same input.
# The key hashes clang-tidy's version, .clang-tidy, this script, the file's compile command and
# the file preprocessed with comments kept (`clang++ -E -C`: every header it includes, macros
# expanded, NOLINT comments and line markers included), with the source root's path removed so
# that clones in other folders share entries. Any change to the file, to a header it includes or
# to the checks runs clang-tidy again; findings are never cached.
cache=${LINT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dptrain-lint}
[ "$cache" = off ] || mkdir -p "$cache/tidy"
/usr/bin/python3 - "$build/lint/compile_commands.json" "$build/lint/preprocess" "$root" <<'PY'
import json, os, shlex, sys
src, out, root = sys.argv[1:]
os.makedirs(out, exist_ok=True)
for e in json.load(open(src)):
    args = e["arguments"] if "arguments" in e else shlex.split(e["command"])
    pre, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
        elif a not in ("-c", "-MD", "-MMD"):
            pre.append(a)
    name = os.path.relpath(e["file"], root).replace(os.sep, "_")
    with open(os.path.join(out, name + ".sh"), "w") as f:
        f.write("cd %s && %s -E -C -w -o -\n" % (shlex.quote(e["directory"]),
                                               " ".join(shlex.quote(a) for a in pre)))
PY
export LINT_KEY_SALT
LINT_KEY_SALT="$tidy_version $(cat .clang-tidy scripts/lint.sh | sha256sum)"
# One process per file; output collected per file so that parallel runs do not interleave.
rm -rf "$build/lint/tidy" && mkdir -p "$build/lint/tidy"
printf '%s\n' "${files[@]}" | xargs -P "$jobs" -I{} sh -c \
  'name=$(echo "$1" | tr / _)
   out="$2/lint/tidy/$name.txt"
   key=""
   if [ "$3" != off ]; then
     key=$( { echo "$LINT_KEY_SALT"; sed "s|$4||g" "$2/lint/preprocess/$name.sh";
              sh "$2/lint/preprocess/$name.sh" 2>&1 | sed "s|$4||g"; } | sha256sum | cut -c1-40)
     if [ -f "$3/tidy/$key" ]; then echo "$1: clean (cached)" >"$2/lint/tidy/$name.cached"; exit 0; fi
   fi
   if clang-tidy -p "$2/lint" --quiet "$1" >"$out" 2>&1; then
     [ -z "$key" ] || touch "$3/tidy/$key"
   else
     echo "$1" >>"$out.failed"
   fi' _ {} "$build" "$cache" "$root"
cached=$(find "$build/lint/tidy" -name '*.cached' | wc -l)
[ "$cache" = off ] || echo "lint: $cached of ${#files[@]} files unchanged since a clean clang-tidy run ($cache)"
for f in "$build"/lint/tidy/*.txt; do
  [ -e "$f" ] || continue
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
