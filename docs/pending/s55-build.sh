#!/usr/bin/env bash
# Builds the working tree in ./build-gpu (HEAD plus any uncommitted change; session 55
# ran it on the block permutation's grid form before it landed; PERFORMANCE.md session
# 55) as `m`, and HEAD's mxmoe in a worktree as `o`, and packs both with the round script
# into .gpubin/s55a. Run from the repository root. Then one device call:
#   bash .gpubin/s55a/round.sh   with carry [".gpubin/s55a"]
set -eu
R=$PWD
out=$R/.gpubin/s55a; mkdir -p $out
wt=/tmp/s55-main
[ -e $wt/.git ] || { git worktree prune; git worktree add --detach $wt HEAD; }
(cd $wt && git checkout -q --detach $(cd $R && git rev-parse HEAD) && git checkout -q -- .
 cmake -B build-gpu -G Ninja -DMXMOE_CUDA_ARCHS=90a -DCMAKE_BUILD_TYPE=Release > /dev/null
 ninja -C build-gpu mxmoe_cli > build.log 2>&1 || { tail -20 build.log; exit 1; })
cmake -B build-gpu -G Ninja -DMXMOE_CUDA_ARCHS=90a -DCMAKE_BUILD_TYPE=Release > /dev/null
ninja -C build-gpu mxmoe_cli test_engine test_layer_args > /tmp/s55-m-build.log 2>&1 || { tail -20 /tmp/s55-m-build.log; exit 1; }
stage=$(mktemp -d); mkdir -p $stage/m $stage/o
cp build-gpu/mxmoe build-gpu/tests/test_engine build-gpu/tests/test_layer_args $stage/m/
cp $wt/build-gpu/mxmoe $stage/o/
strip $stage/m/* $stage/o/*
tar cJf $out/bins.tar.xz -C $stage m o
cp $R/docs/pending/s55-round.sh $out/round.sh; cp $R/docs/pending/s55-round2.sh $out/round2.sh; cp $R/docs/pending/s55-round3.sh $out/round3.sh; cp $R/docs/pending/s55-round4.sh $out/round4.sh
{ echo "m: $(git rev-parse --short HEAD) + $(git diff HEAD --stat | tail -1)"; echo "o: $(git rev-parse --short HEAD)"; } > $out/BUILT
ls -la $out
