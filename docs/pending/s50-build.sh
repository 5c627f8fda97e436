#!/usr/bin/env bash
# Builds session 50's round binaries from main and the pending patches, and packs them with
# the round script into .gpubin/s50a: h = s49-stage-hint.patch (x's routed-order staging
# with its stores L2 evict-first), L = s50-gather.patch (x staged once per token, GEMM1
# gathering its rows by cp.async). Each is what would land. Run from the repository root
# on the development machine (2 cores: 8.5 minutes from a clean clone). Then one device call:
#   bash .gpubin/s50a/round1.sh   with carry [".gpubin/s50a"]
set -eu
R=$PWD
base=$(git rev-parse HEAD)
out=$R/.gpubin/s50a; mkdir -p $out
stage=$(mktemp -d)
for v in h L; do
  wt=/tmp/s50-$v
  git worktree remove --force $wt 2>/dev/null || true
  git worktree add --detach $wt $base
  patch=$R/docs/pending/s49-stage-hint.patch; [ $v = L ] && patch=$R/docs/pending/s50-gather.patch
  (cd $wt && git -c user.name=round -c user.email=round@localhost am -q $patch
   cmake -B build-gpu -G Ninja -DMXMOE_CUDA_ARCHS=90a -DCMAKE_BUILD_TYPE=Release > /dev/null
   ninja -C build-gpu mxmoe_cli test_engine > build.log 2>&1 || { tail -20 build.log; exit 1; })
  mkdir -p $stage/$v
  cp $wt/build-gpu/mxmoe $wt/build-gpu/tests/test_engine $stage/$v/
  strip $stage/$v/*
done
tar cJf $out/bins.tar.xz -C $stage h L
cp $R/docs/pending/s50-round.sh $out/round1.sh
ls -la $out
