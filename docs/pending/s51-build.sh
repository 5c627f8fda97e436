#!/usr/bin/env bash
# Builds session 51's round binary from main and s51-scatter.patch (x's routed-row staging
# scattered by token; what would land) and packs it with the round script into
# .gpubin/s51a. Run from the repository root on the development machine (~2-5 minutes on 2
# cores). Then one device call:
#   bash .gpubin/s51a/round.sh   with carry [".gpubin/s51a"]
set -eu
R=$PWD
base=$(git rev-parse HEAD)
out=$R/.gpubin/s51a; mkdir -p $out
wt=/tmp/s51-S
git worktree remove --force $wt 2>/dev/null || true
git worktree add --detach $wt $base
(cd $wt && git -c user.name=round -c user.email=round@localhost am -q $R/docs/pending/s51-scatter.patch
 cmake -B build-gpu -G Ninja -DMXMOE_CUDA_ARCHS=90a -DCMAKE_BUILD_TYPE=Release > /dev/null
 ninja -C build-gpu mxmoe_cli test_engine test_layer_args > build.log 2>&1 || { tail -20 build.log; exit 1; })
stage=$(mktemp -d); mkdir -p $stage/S
cp $wt/build-gpu/mxmoe $wt/build-gpu/tests/test_engine $wt/build-gpu/tests/test_layer_args $stage/S/
strip $stage/S/*
tar cJf $out/bins.tar.xz -C $stage S
cp $R/docs/pending/s51-round.sh $out/round.sh
ls -la $out
