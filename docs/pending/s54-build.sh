#!/usr/bin/env bash
# Builds the working tree (HEAD plus any uncommitted change; session 54 ran it on the
# one-block permutation before it landed: runs 2-3 two forms of it up to 32768 pairs, run
# 5 the landed one; PERFORMANCE.md session 54) for a device round and packs it into
# .gpubin/s54a with main 0a025c2's mxmoe (as `o`, built by s53-build.sh into .gpubin/s53a)
# and the round scripts.
# Run from the repository root. Then one device call:
#   bash .gpubin/s54a/round.sh   with carry [".gpubin/s54a"]
set -eu
R=$PWD
out=$R/.gpubin/s54a; mkdir -p $out
[ -f $R/.gpubin/s53a/bins.tar.xz ] || bash $R/docs/pending/s53-build.sh
wt=/tmp/s54-tree
# An existing worktree is reset to HEAD and reused (its build folder: an incremental build).
[ -d $wt/.git ] || [ -f $wt/.git ] || { git worktree prune; git worktree add --detach $wt HEAD; }
(cd $wt && git checkout -q --detach $(cd $R && git rev-parse HEAD) && git checkout -q -- . )
git diff HEAD | (cd $wt && git apply --allow-empty)
(cd $wt && cmake -B build-gpu -G Ninja -DMXMOE_CUDA_ARCHS=90a -DCMAKE_BUILD_TYPE=Release > /dev/null
 ninja -C build-gpu mxmoe_cli test_engine test_layer_args > build.log 2>&1 || { tail -20 build.log; exit 1; })
stage=$(mktemp -d); mkdir -p $stage/m $stage/o
cp $wt/build-gpu/mxmoe $wt/build-gpu/tests/test_engine $wt/build-gpu/tests/test_layer_args $stage/m/
tar xJf $R/.gpubin/s53a/bins.tar.xz -C $stage/o m/mxmoe && mv $stage/o/m/mxmoe $stage/o/mxmoe && rmdir $stage/o/m
strip $stage/m/*
tar cJf $out/bins.tar.xz -C $stage m o
cp $R/docs/pending/s54-round.sh $out/round.sh; cp $R/docs/pending/s54-ncu.sh $out/ncu.sh
cp $R/docs/pending/s54-check.sh $out/check.sh
{ echo "m: $(git rev-parse --short HEAD) + $(git diff HEAD --stat | tail -1)"; cat $R/.gpubin/s53a/BUILT | sed 's/^/o: /'; } > $out/BUILT
ls -la $out
