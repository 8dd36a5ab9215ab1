#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `dptrain convert --from imagefolder` against torchvision/PIL (imagefolder_oracle.py): a small
# ImageFolder tree of JPEG (RGB, greyscale, CMYK) and PNG (RGB, RGBA, palette, greyscale,
# grey+alpha, 1-bit) images of many sizes, one smaller than the output, is converted at
# --size 32; the file must hold torchvision's order, labels and class names, and every image
# must be within a mean absolute difference of 2/255 of PIL's resize + centre crop. Then: a
# sharded run (>= 2 shards, the same samples, the same pixels with 1 thread), a rerun that keeps
# the complete shards and redoes a damaged one, a truncated JPEG (exit 3 naming it, no output
# file, no .tmp; with shards the earlier shards stay and the one being built is not written),
# --skip-bad (left out, listed, the rest unchanged), and the command line errors (exit 2).
# shellcheck disable=SC2034  # CASE is read by expect_ok / expect_fail (lib.sh)
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PY=/usr/bin/python3
if ! "$PY" -c 'import PIL, h5py, numpy' 2>/dev/null; then
  skip "no $PY with PIL, h5py and numpy (scripts/install-deps.sh installs python3-pil)"
  finish
fi
ORACLE=$DPTRAIN_SRC/tests/integration/imagefolder_oracle.py
IN=$TMP/in
"$PY" "$ORACLE" make "$IN" || {
  fail "the oracle could not build the image folder"
  finish
}
# expect_ok / expect_fail run a command under timeout: an array, not a function.
CONV=("$DPTRAIN" convert --from imagefolder --input)
# oracle CASE ARGS...: the oracle's check passes (its verdict line is printed).
oracle() {
  local what=$1
  shift
  if "$PY" "$ORACLE" "$@" >"$TMP/oracle.out" 2>&1; then
    pass "$what: $(tail -n 1 "$TMP/oracle.out")"
  else
    fail "$what"
    sed 's/^/  | /' "$TMP/oracle.out"
  fi
}
no_tmp() { ! compgen -G "$1/*.tmp" >/dev/null; }

# ---- one file ----
CASE="convert --size 32"
expect_ok -- "${CONV[@]}" "$IN" --out "$TMP/one.h5" --size 32
oracle "one file: order, labels, class_names, shape, pixels vs PIL" check "$IN" 32 "$TMP/one.h5"
CASE="convert --size 32 --threads 1"
expect_ok -- "${CONV[@]}" "$IN" --out "$TMP/t1.h5" --size 32 --threads 1
oracle "the same samples with 1 thread" same "$TMP/one.h5" "$TMP/t1.h5"

# ---- shards: 3 x 32 x 32 = 3072 bytes a sample, 10KB = 3 samples a shard ----
mkdir -p "$TMP/sh"
CASE="convert --shard-size 10KB"
expect_ok -- "${CONV[@]}" "$IN" --out "$TMP/sh/train.h5" --size 32 --shard-size 10KB
mapfile -t SHARDS < <(compgen -G "$TMP/sh/train-*.h5" | sort)
check "sharded: ${#SHARDS[@]} shards train-00000.h5 ... (>= 2), no .tmp" \
  test "${#SHARDS[@]}" -ge 2 -a -f "$TMP/sh/train-00000.h5" -a ! -e "$TMP/sh/train.h5"
check "no .tmp left" no_tmp "$TMP/sh"
oracle "shards together hold the folder" check "$IN" 32 "${SHARDS[@]}"
CASE="rerun keeps every shard"
expect_ok -- "${CONV[@]}" "$IN" --out "$TMP/sh/train.h5" --size 32 --shard-size 10KB
check "rerun: each shard reported as skipped, none written" \
  test "$(grep -c '^skipped .*train-0.*complete from an earlier run' "$TMP/last.out")" \
  = "${#SHARDS[@]}" -a "$(grep -c '^wrote' "$TMP/last.out")" = 0
head -c 1000 "${SHARDS[1]}" >"$TMP/cut" && mv "$TMP/cut" "${SHARDS[1]}"
CASE="rerun redoes a damaged shard"
expect_ok -- "${CONV[@]}" "$IN" --out "$TMP/sh/train.h5" --size 32 --shard-size 10KB
check "rerun: only the damaged shard written" \
  test "$(grep '^wrote' "$TMP/last.out")" = "wrote ${SHARDS[1]}"
oracle "shards after the repair" check "$IN" 32 "${SHARDS[@]}"

# ---- a truncated JPEG ----
BAD=$TMP/bad
cp -r "$IN" "$BAD"
# Cut inside the entropy-coded data: libjpeg's "Premature end of JPEG file" is only a warning
# (it would fill the rest with grey), which must count as an error.
head -c $(($(stat -c %s "$IN/dog/b.jpg") * 6 / 10)) "$IN/dog/b.jpg" >"$BAD/dog/bb.jpg"
CASE="truncated JPEG: exit 3 naming the file"
expect_fail 3 "$BAD/dog/bb.jpg: corrupt JPEG data" -- "${CONV[@]}" "$BAD" --out "$TMP/bad.h5" --size 32
check "truncated JPEG: no output file, no .tmp" test ! -e "$TMP/bad.h5" -a ! -e "$TMP/bad.h5.tmp"
mkdir -p "$TMP/badsh"
CASE="truncated JPEG, sharded: exit 3"
expect_fail 3 "$BAD/dog/bb.jpg: corrupt JPEG data" -- \
  "${CONV[@]}" "$BAD" --out "$TMP/badsh/x" --size 32 --shard-size 10KB
# dog/bb.jpg is sample 21 (Zebra 10, cat 9, dog/a, dog/b): shards 0..6 are complete.
check "sharded: shards before the bad one written, the one being built not, no .tmp" \
  test -f "$TMP/badsh/x-00006.h5" -a ! -e "$TMP/badsh/x-00007.h5" -a ! -e "$TMP/badsh/x-00007.h5.tmp"
CASE="--skip-bad"
expect_ok -- "${CONV[@]}" "$BAD" --out "$TMP/skip.h5" --size 32 --skip-bad
check "--skip-bad lists the image" \
  grep -q '^skipped 1 unreadable image: dog/bb.jpg (corrupt JPEG data: ' "$TMP/last.out"
oracle "--skip-bad: the rest unchanged" check "$BAD" 32 "$TMP/skip.h5" --skip dog/bb.jpg
printf 'not a picture' >"$BAD/cat/fake.png"
head -c 300 "$IN/dog/a.png" >"$BAD/cat/short.png"
head -c 600 "$IN/dog/b.jpg" >"$BAD/cat/hdr.jpg"
# One thread: the image after a JPEG whose header fails is decoded by the same worker.
CASE="--skip-bad, sharded, 1 thread, 4 bad images"
expect_ok -- "${CONV[@]}" "$BAD" --out "$TMP/skipsh.h5" --size 32 --skip-bad --shard-size 10KB \
  --threads 1
check "--skip-bad lists all four in sample order" \
  grep -q '^skipped 4 unreadable images: cat/fake.png (.*), cat/hdr.jpg (corrupt JPEG header: .*), cat/short.png (corrupt PNG: .*), dog/bb.jpg' \
  "$TMP/last.out"
mapfile -t SKIPSH < <(compgen -G "$TMP/skipsh-*.h5" | sort)
oracle "--skip-bad, sharded: the rest unchanged" check "$BAD" 32 "${SKIPSH[@]}" \
  --skip cat/fake.png --skip cat/hdr.jpg --skip cat/short.png --skip dog/bb.jpg
CASE="--skip-bad rerun lists the kept shards' skipped images"
expect_ok -- "${CONV[@]}" "$BAD" --out "$TMP/skipsh.h5" --size 32 --skip-bad --shard-size 10KB
check "rerun: nothing written, the four still listed" \
  grep -q '^skipped 4 unreadable images: cat/fake.png' "$TMP/last.out"
# A FIFO named like an image: opening it would block a worker for good.
PIPED=$TMP/piped
cp -r "$IN" "$PIPED"
mkfifo "$PIPED/cat/pipe.png"
CASE="a FIFO named like an image, --skip-bad (no hang)"
expect_ok -- "${CONV[@]}" "$PIPED" --out "$TMP/piped.h5" --size 32 --skip-bad
check "--skip-bad lists the FIFO" \
  grep -q '^skipped 1 unreadable image: cat/pipe.png (cannot read the file: it is not a regular file' \
  "$TMP/last.out"
CASE="a FIFO named like an image: exit 3 (no hang)"
expect_fail 3 "$PIPED/cat/pipe.png: cannot read the file: it is not a regular file" -- \
  "${CONV[@]}" "$PIPED" --out "$TMP/piped2.h5" --size 32
CASE="corrupt PNG without --skip-bad: exit 3"
expect_fail 3 "$BAD/cat/fake.png: not a JPEG or PNG file" -- \
  "${CONV[@]}" "$BAD" --out "$TMP/bad2.h5" --size 32

# ---- folders and options ----
mkdir -p "$TMP/empty" "$TMP/noimg/a" "$TMP/nl/$(printf 'x\ny')"
touch "$TMP/noimg/a/readme.txt"
printf 'x' >"$TMP/nl/$(printf 'x\ny')/a.jpg"
CASE="a folder without class folders"
expect_fail 3 "$TMP/empty: no class folders" -- "${CONV[@]}" "$TMP/empty" --out "$TMP/e.h5" --size 32
CASE="a class folder without images"
expect_fail 3 "$TMP/noimg/a: no images (.jpg, .jpeg, .png) in this class folder" -- \
  "${CONV[@]}" "$TMP/noimg" --out "$TMP/e.h5" --size 32
CASE="a class name with a newline"
expect_fail 3 "a class folder name may not contain a newline" -- \
  "${CONV[@]}" "$TMP/nl" --out "$TMP/e.h5" --size 32
CASE="--size missing"
expect_fail 2 "convert --from imagefolder needs --input DIR and --size S" -- \
  "${CONV[@]}" "$IN" --out "$TMP/e.h5"
CASE="--shard-size smaller than a sample"
expect_fail 2 "--shard-size 1000 bytes is smaller than one sample (3072 bytes" -- \
  "${CONV[@]}" "$IN" --out "$TMP/e.h5" --size 32 --shard-size 1000
CASE="--shard-size not a size"
expect_fail 2 "--shard-size: '10XB' is not a positive size" -- \
  "${CONV[@]}" "$IN" --out "$TMP/e.h5" --size 32 --shard-size 10XB
CASE="--size with --from idx"
expect_fail 2 "are options of convert --from imagefolder, not --from idx" -- \
  "$DPTRAIN" convert --from idx --images a --labels b --out "$TMP/e.h5" --size 32
check "no output from the failed runs" test ! -e "$TMP/e.h5"

# ---- libvips is loaded when a conversion needs it, not linked ----
ldd "$DPTRAIN" >"$TMP/ldd.txt" || true
check "dptrain does not link libvips (ldd)" bash -c "test -s '$TMP/ldd.txt' && ! grep -q libvips '$TMP/ldd.txt'"
VIPS_LIB=$(ldconfig -p | awk '$1 ~ /^libvips\.so\.[0-9]+$/ {print $NF; exit}')
if [ -n "$VIPS_LIB" ] && unshare -m true 2>/dev/null; then
  # A private mount namespace where libvips is an empty file: dlopen fails as on a host
  # without the package.
  : >"$TMP/empty.so"
  HIDE_VIPS=(unshare -m bash -c 'mount --bind "$1" "$(readlink -f "$2")" && shift 2 && exec "$@"'
    _ "$TMP/empty.so" "$VIPS_LIB")
  CASE="libvips missing: exit 2 naming the library and the package, before listing"
  expect_fail 2 "convert --from imagefolder resizes with libvips and cannot load it" -- \
    "${HIDE_VIPS[@]}" "${CONV[@]}" "$TMP/empty" --out "$TMP/e.h5" --size 32
  check "libvips missing: the package is named" grep -q "(Debian/Ubuntu: libvips42, libvips42t64" \
    "$TMP/last.err"
  CASE="libvips missing: dptrain info says so"
  expect_ok -- "${HIDE_VIPS[@]}" "$DPTRAIN" info
  check "info: libvips not loadable" grep -q "^  libvips .*not loadable (" "$TMP/last.out"
  write_base_config "$TMP/base.toml"
  CASE="libvips missing: training does not need it"
  expect_ok -- "${HIDE_VIPS[@]}" "$DPTRAIN" train --config "$TMP/base.toml" \
    --set "run_dir=$TMP/novips"
else
  skip "libvips missing: no libvips in ldconfig's cache or no mount namespaces (unshare -m)"
fi
CASE="dptrain info names libvips' version"
expect_ok -- "$DPTRAIN" info
check "info: libvips version" grep -Eq "^  libvips +[0-9]+\.[0-9]+" "$TMP/last.out"

finish
