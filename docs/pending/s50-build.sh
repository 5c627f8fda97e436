#!/usr/bin/env bash
# Builds session 50's two round binaries from main + the pending patches and packs them for
# docs/pending/s50-round.sh: h = s49-stage-hint.patch, p = h + s50-probes.patch.
# Run from the repository root on the development machine (2 cores: ~15 minutes).
# Then: mkdir -p .gpubin/s50a && cp docs/pending/s50-round.sh .gpubin/s50a/round1.sh, and
# the device call `bash .gpubin/s50a/round1.sh` with carry [".gpubin/s50a"].
set -eu
R=$PWD
base=$(git rev-parse HEAD)
out=$R/.gpubin/s50a; mkdir -p $out
stage=$(mktemp -d)
for v in h p; do
  wt=/tmp/s50-$v
  git worktree remove --force $wt 2>/dev/null || true
  git worktree add --detach $wt $base
  (cd $wt && git -c user.name=round -c user.email=round@localhost am -q $R/docs/pending/s49-stage-hint.patch
   [ $v = p ] && git -c user.name=round -c user.email=round@localhost am -q $R/docs/pending/s50-probes.patch
   cmake -B build-gpu -G Ninja -DMXMOE_CUDA_ARCHS=90a -DCMAKE_BUILD_TYPE=Release > /dev/null
   ninja -C build-gpu mxmoe_cli test_engine > build.log 2>&1 || { tail -20 build.log; exit 1; })
  mkdir -p $stage/$v
  cp $wt/build-gpu/mxmoe $wt/build-gpu/tests/test_engine $stage/$v/
  strip $stage/$v/*
done
tar cJf $out/bins.tar.xz -C $stage h p
cp $R/docs/pending/s50-round.sh $out/round1.sh
ls -la $out
