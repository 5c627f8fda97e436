#!/usr/bin/env bash
# Builds main (HEAD, no patch) for the next device round and packs it with the round
# script into .gpubin/s53a (~2.5 minutes on 2 cores). Run from the repository root. Then
# one device call:   bash .gpubin/s53a/round.sh   with carry [".gpubin/s53a"]
set -eu
R=$PWD
out=$R/.gpubin/s53a; mkdir -p $out
wt=/tmp/s53-main
git worktree remove --force $wt 2>/dev/null || true
git worktree add --detach $wt HEAD
(cd $wt && cmake -B build-gpu -G Ninja -DMXMOE_CUDA_ARCHS=90a -DCMAKE_BUILD_TYPE=Release > /dev/null
 ninja -C build-gpu mxmoe_cli test_engine test_layer_args > build.log 2>&1 || { tail -20 build.log; exit 1; })
stage=$(mktemp -d); mkdir -p $stage/m
cp $wt/build-gpu/mxmoe $wt/build-gpu/tests/test_engine $wt/build-gpu/tests/test_layer_args $stage/m/
strip $stage/m/*
tar cJf $out/bins.tar.xz -C $stage m
cp $R/docs/pending/s53-round.sh $out/round.sh
cp $R/docs/pending/s53-round-min.sh $out/round_min.sh
echo "built from $(git rev-parse --short HEAD)" > $out/BUILT
ls -la $out
