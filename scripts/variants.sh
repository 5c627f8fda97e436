#!/usr/bin/env bash
# scripts/variants.sh — `mxmoe` binaries for an A/B run on the GPU machine: one for this
# checkout and one after each prefix of a patch series, so that one device run can time
# every step of the series against the same baseline (PERFORMANCE.md, sessions 39-45).
#
# Each variant recompiles only the CUDA files named in TUS, from a copy of HEAD with the
# patches applied, with the build's own nvcc command; puts the objects into a copy of the
# build's libmxmoe.a and links mxmoe with the build's own link command. So TUS must name
# every source file whose code the patches change (headers included: a header's change
# reaches only the files recompiled). Nothing in the checkout or the build is modified.
#
#   usage: scripts/variants.sh BUILD OUT TUS [PATCH...]
#     BUILD  a build directory of this checkout, built from HEAD (CMake + ninja, `mxmoe`)
#     OUT    OUT/a/mxmoe is the build's binary, OUT/b/mxmoe the one after the first patch,
#            OUT/c/mxmoe after the first two, ... (stripped)
#     TUS    comma-separated file names under src/cuda, e.g. gemm1_act.cu,gemm2.cu, or
#            paths under src/ for other directories, e.g. cpu/routing.cpp, or names of
#            src/ itself, e.g. moe.cpp (a header shared by host and device code, such as
#            activation_math.h, reaches both)
#
# Example (session 39's series):
#   bash scripts/variants.sh build-gpu /tmp/var gemm1_act.cu,gemm2.cu series/000*.patch
set -euo pipefail
if [ $# -lt 3 ]; then
  sed -n '2,/^[^#]/{/^#/p}' "$0" >&2  # the header comment
  exit 2
fi
BUILD=$(cd "$1" && pwd)
OUT=$(mkdir -p "$2" && cd "$2" && pwd)
IFS=',' read -r -a TUS <<< "$3"
shift 3
PATCHES=()
for p in "$@"; do PATCHES+=("$(cd "$(dirname "$p")" && pwd)/$(basename "$p")"); done
ROOT=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)

[ -x "$BUILD/mxmoe" ] || { echo "variants.sh: $BUILD/mxmoe is not built" >&2; exit 1; }
COMMANDS=$(cd "$BUILD" && ninja -t commands mxmoe)  # every compile and the link, once
LINK=$(echo "$COMMANDS" | tail -1 | sed 's/^: && //; s/ && :$//')
case "$LINK" in *" -o mxmoe "*) ;; *) echo "variants.sh: unexpected link command: $LINK" >&2; exit 1 ;; esac

mkdir -p "$OUT/a"
cp "$BUILD/mxmoe" "$OUT/a/mxmoe"
strip "$OUT/a/mxmoe"

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# A TUS entry with a slash is a path under src/ (cpu/routing.cpp); a bare name is a file
# of src/cuda, or of src/ itself where src/cuda has none (moe.cpp).
tu_path() {
  case "$1" in
    */*) echo "src/$1" ;;
    *) if [ -e "$ROOT/src/cuda/$1" ]; then echo "src/cuda/$1"; else echo "src/$1"; fi ;;
  esac
}
letters=(b c d e f g h i j k l m n o p q r s t u v w x y z)
for ((n = 1; n <= ${#PATCHES[@]}; ++n)); do
  v=${letters[$((n - 1))]}
  src="$WORK/src_$v"
  mkdir -p "$src" "$WORK/obj_$v" "$OUT/$v"
  git -C "$ROOT" archive HEAD | tar x -C "$src"
  for ((i = 0; i < n; ++i)); do (cd "$src" && git apply "${PATCHES[$i]}"); done
  cp "$BUILD/libmxmoe.a" "$WORK/obj_$v/libmxmoe.a"
  pids=()
  for tu in "${TUS[@]}"; do
    rel=$(tu_path "$tu") base=$(basename "$tu")
    cmd=$(echo "$COMMANDS" | grep -E " $ROOT/$rel( |\$)" | head -1)
    [ -n "$cmd" ] || { echo "variants.sh: no compile command for $rel" >&2; exit 1; }
    # The copy's sources and headers; no dependency file; the object under its archive name.
    cmd=$(echo "$cmd" | sed -E "s# -MD -MT [^ ]+ -MF [^ ]+##; s#-I$ROOT/include#-I$src/include#g; \
      s#$ROOT/$rel#$src/$rel#; s# -o [^ ]+# -o $WORK/obj_$v/$base.o#")
    (cd "$BUILD" && eval "$cmd") > "$WORK/obj_$v/$base.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || { cat "$WORK"/obj_"$v"/*.log >&2; exit 1; }; done
  for tu in "${TUS[@]}"; do
    base=$(basename "$tu")
    grep -h "spill" "$WORK/obj_$v/$base.log" | sed "s#^#$v: #" || true
    ar r "$WORK/obj_$v/libmxmoe.a" "$WORK/obj_$v/$base.o"
  done
  (cd "$BUILD" && eval "$(echo "$LINK" | sed "s# libmxmoe.a # $WORK/obj_$v/libmxmoe.a #g; s# -o mxmoe # -o $OUT/$v/mxmoe #")")
  strip "$OUT/$v/mxmoe"
  echo "variants.sh: $v = HEAD + ${n} patch(es), $(basename "${PATCHES[$((n - 1))]}")"
done
