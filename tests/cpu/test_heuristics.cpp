// The CUDA engine's shape heuristics that are plain arithmetic (src/cuda/heuristics.h),
// checked on the host: they run in CI, where no GPU is, while test_engine checks on the
// H200 that the kernels follow them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <utility>

#include "../../src/cuda/heuristics.h"

namespace {

namespace cd = mxmoe::cuda_detail;

TEST(PrefillSplit, KimiShapesSplitAsPlanned) {
  // GEMM1 (K = 3584: 56 chunks; 24 row blocks x 28 experts = 672 tiles) and GEMM2 (K =
  // 3072: 48 chunks; 14 x 28 = 392 tiles) at one expert tile each.
  EXPECT_TRUE(cd::prefill_claims(true, 32));  // GEMM1 at two CTAs per SM claims its items
  EXPECT_FALSE(cd::prefill_claims(false, 32));
  EXPECT_FALSE(cd::prefill_claims(true, 64));
  EXPECT_FALSE(cd::prefill_claims(true, 128));
  // Claimed: the CTAs' last round of claims is all quarter tiles.
  const cd::PfSplit g1_32 = cd::pf_split(true, 672, 264, 56, 32);
  EXPECT_EQ(g1_32.tiles, 66);
  EXPECT_EQ(g1_32.parts, 4);
  // Dealt: a last wave of rem <= G / 2 tiles, one part per CTA (at most 4).
  const cd::PfSplit g1_128 = cd::pf_split(false, 672, 132, 56, 128);
  EXPECT_EQ(g1_128.tiles, 12);
  EXPECT_EQ(g1_128.parts, 4);
  const cd::PfSplit g2_32 = cd::pf_split(false, 392, 264, 48, 32);
  EXPECT_EQ(g2_32.tiles, 128);
  EXPECT_EQ(g2_32.parts, 2);
  const cd::PfSplit g2_128 = cd::pf_split(false, 392, 132, 48, 128);  // rem 128 of 132: whole
  EXPECT_EQ(g2_128.parts, 1);
  EXPECT_EQ(g2_128.tiles, 0);
}

TEST(PrefillSplit, TailFitsTheWorkspaceAndTheChunks) {
  for (bool claimed : {false, true})
    for (int tok : {32, 64, 128})
      for (int ctas : {1, 2, 3, 7, 64, 132, 264, 1000})
        for (int kc : {1, 4, 7, 8, 12, 16, 48, 56})
          for (int tiles : {0, 1, 2, 5, 33, 66, 131, 672, 5000}) {
            SCOPED_TRACE(testing::Message() << "claimed " << claimed << " tiles " << tiles << " ctas " << ctas
                                            << " kc " << kc << " tok " << tok);
            const cd::PfSplit split = cd::pf_split(claimed, tiles, ctas, kc, tok);
            const int rem = ctas > 0 ? tiles % ctas : 0;
            if (split.parts == 1) {
              EXPECT_EQ(split.tiles, 0);
              // Claimed: no split only where a part would hold fewer than the minimum of
              // chunks. Dealt: also where the last wave is empty or over half the CTAs.
              if (claimed && tiles > 0) EXPECT_LT(kc, 2 * cd::kPfMinSplitChunks);
              if (!claimed && rem > 0 && 2 * rem <= ctas && tok == 32)
                EXPECT_LT(kc, 2 * cd::kPfMinSplitChunks);
              continue;
            }
            EXPECT_GE(split.parts, 2);
            EXPECT_LE(split.parts, cd::kPfMaxSplitParts);
            EXPECT_GE(kc / split.parts, cd::kPfMinSplitChunks);
            EXPECT_GE(split.tiles, 1);
            EXPECT_LE(split.tiles, std::min(tiles, cd::kPfSplitTiles));
            // Every part's partial sums (256 threads x tok fp32) fit the split workspace.
            const size_t capacity_parts = cd::kPfSplitBytes / (256 * sizeof(float) * tok);
            EXPECT_LE(static_cast<size_t>(split.tiles) * split.parts, capacity_parts);
            if (!claimed) {
              // Dealt: exactly the last wave, one part per CTA.
              EXPECT_EQ(split.tiles, rem);
              EXPECT_LE(split.tiles * split.parts, ctas);
              continue;
            }
            // Claimed: a last round of one part per CTA, unless the tiles or the workspace
            // run out, and no more.
            if (split.tiles < tiles && split.tiles < cd::kPfSplitTiles &&
                static_cast<size_t>(split.tiles + 1) * split.parts <= capacity_parts)
              EXPECT_GE(split.tiles * split.parts, ctas);
            EXPECT_LT((split.tiles - 1) * split.parts, ctas);
          }
}

TEST(PrefillTokenTile, KimiShapesPickTheTileWhoseExpectedTilesCostLeast) {
  // Rows per local expert if every routed pair were local: M x 16 / 28, spread binomially.
  const std::pair<int64_t, int> kimi[] = {
      {1, 32},    {54, 32},   {55, 64},   {109, 64},  {110, 96},  {128, 96},   {159, 96},
      {160, 128}, {230, 128}, {231, 96},  {256, 96},  {332, 96},  {333, 128},  {448, 128},
      {449, 96},  {509, 96},  {510, 128}, {1024, 128}, {4096, 128}};
  for (const auto& [m, tile] : kimi) EXPECT_EQ(cd::prefill_token_tile(m, 16, 28), tile) << "M " << m;
  EXPECT_EQ(cd::prefill_token_tile(0, 16, 28), 32);   // no rows: the smallest tile
  EXPECT_EQ(cd::prefill_token_tile(8, 4, 0), 64);     // no local expert count: 32 rows, Poisson spread
  EXPECT_EQ(cd::prefill_token_tile(40, 16, 8), 96);   // every expert routed: exactly 80 rows
  EXPECT_EQ(cd::prefill_token_tile(1 << 24, 16, 28), 128);
  EXPECT_NEAR(cd::pf_expected_tiles(100, 0, 96), 2.0, 1e-12);
  EXPECT_NEAR(cd::pf_expected_tiles(96, 0, 96), 1.0, 1e-12);
  EXPECT_NEAR(cd::pf_expected_tiles(96.5, 4, 96), 1.5, 1e-9);  // half the experts past 96
  EXPECT_TRUE(cd::pf_tma_rows(96) && cd::pf_tma_rows(128) && !cd::pf_tma_rows(64) && !cd::pf_tma_rows(32));
}

TEST(DecodeLaunch, GemmOneIsProgrammaticAtOneKimiTokenOnly) {
  // Kimi (top-16, 28 local): one token is the one-token kernel; two and more the balanced one.
  EXPECT_TRUE(cd::use_programmatic_gemm1(true, cd::use_balanced(1), 1 * 16));
  EXPECT_FALSE(cd::use_programmatic_gemm1(true, cd::use_balanced(2), 2 * 16));
  EXPECT_FALSE(cd::use_programmatic_gemm1(false, false, 16));  // before sm_90, or MXMOE_PDL=0
  EXPECT_FALSE(cd::use_programmatic_gemm1(true, false, cd::kG1HintMaxPairs + 1));  // ids past a warp
  EXPECT_TRUE(cd::use_programmatic_launch(true, 4) && !cd::use_programmatic_launch(true, 1));
  // GEMM2 waiting on the expert-ready counters is a programmatic dependent at any split.
  EXPECT_TRUE(cd::use_programmatic_launch(true, 1, true) && !cd::use_programmatic_launch(false, 4, true));
}

TEST(DecodeLaunch, ExpertReadyNeedsBothDecodeKernelsAndProgrammaticLaunches) {
  using cd::ReadyMode;
  EXPECT_TRUE(cd::use_expert_ready(ReadyMode::kOneToken, true, 1, true, true));
  EXPECT_FALSE(cd::use_expert_ready(ReadyMode::kOneToken, true, 2, true, true));
  EXPECT_TRUE(cd::use_expert_ready(ReadyMode::kDecode, true, 15, true, true));
  EXPECT_FALSE(cd::use_expert_ready(ReadyMode::kOff, true, 1, true, true));
  EXPECT_FALSE(cd::use_expert_ready(ReadyMode::kDecode, false, 1, true, true));  // no PDL
  // A generic GEMM1 does not count, and GEMM2's generic kernel does not wait.
  EXPECT_FALSE(cd::use_expert_ready(ReadyMode::kDecode, true, 1, false, true));
  EXPECT_FALSE(cd::use_expert_ready(ReadyMode::kDecode, true, 1, true, false));
  // Every row group over every 8-row tile: Kimi's 96 row groups of W13.
  EXPECT_EQ(cd::expert_ready_target(96, 1), 96u);
  EXPECT_EQ(cd::expert_ready_target(96, 8), 96u);
  EXPECT_EQ(cd::expert_ready_target(96, 9), 192u);
  EXPECT_EQ(cd::expert_ready_target(96, 0), 0u);
  // GEMM2 is capped only unsplit, from 2 tokens, under the counters.
  EXPECT_TRUE(cd::gemm2_ready_capped(8, 1, true));
  EXPECT_FALSE(cd::gemm2_ready_capped(1, 4, true) || cd::gemm2_ready_capped(4, 2, true) ||
               cd::gemm2_ready_capped(8, 1, false));
  // One token: 3 splits for the one-row kernel (Kimi: 672 blocks, every one resident).
  EXPECT_EQ(cd::gemm2_splits(1, true, false), 3);
  EXPECT_EQ(cd::gemm2_splits(1, true, true), 1);  // a bias: no split
  EXPECT_TRUE(cd::gemm2_one_row(1));
  EXPECT_FALSE(cd::gemm2_one_row(2));
  EXPECT_EQ(cd::gemm2_splits(3, true, false), 2);
  EXPECT_EQ(cd::gemm2_splits(4, true, false), 2);
  EXPECT_EQ(cd::gemm2_splits(2, true, false), 1);
  EXPECT_EQ(cd::gemm2_splits(5, true, false), 1);
}

TEST(DecodeLaunch, SharedMemoryForBlocksPerSmFitsExactlyThatMany) {
  const size_t sm = 228 * 1024;
  for (size_t fixed : {size_t{2304}, size_t{1024}, size_t{5000}})
    for (int blocks = 1; blocks <= 6; ++blocks) {
      const size_t dyn = cd::smem_for_blocks_per_sm(4096, fixed, sm, blocks);
      EXPECT_EQ(dyn % 128, 0u);
      EXPECT_LE(blocks * (dyn + fixed), sm) << blocks << " blocks must fit";
      EXPECT_GT((blocks + 1) * (dyn + fixed), sm) << blocks + 1 << " must not";
    }
  // Never below what the kernel needs.
  EXPECT_EQ(cd::smem_for_blocks_per_sm(200000, 2304, sm, 3), 200000u);
}

// The two-kernel permutation's segments (permute.cu): whole warps' runs of pairs (512),
// at most kPermuteSegmentPairs each up to kPermuteMaxSegments x that many pairs, none
// empty, all pairs covered. Kimi's M=4096 (65536 pairs) takes 16 segments of 4096 (one block step
// each), M=1024 four.
TEST(Permute, SegmentsCoverThePairsInWholeRunsNoneEmpty) {
  EXPECT_EQ(cd::permute_segments(513), 1);
  EXPECT_EQ(cd::permute_segments(cd::kPermuteSegmentPairs), 1);
  EXPECT_EQ(cd::permute_segments(cd::kPermuteSegmentPairs + 1), 2);
  EXPECT_EQ(cd::permute_segments(16384), 4);
  EXPECT_EQ(cd::permute_segments(65536), 16);
  EXPECT_EQ(cd::permute_segment_length(65536), 4096);
  EXPECT_EQ(cd::permute_segments(65537), 15);  // 4608 each: the 16th would be empty
  EXPECT_EQ(cd::permute_segments(int64_t{1} << 24), cd::kPermuteMaxSegments);
  for (int64_t pairs = 1; pairs < (int64_t{1} << 22); pairs = pairs * 5 / 4 + 7) {
    const int s = cd::permute_segments(pairs);
    const int64_t len = cd::permute_segment_length(pairs);
    EXPECT_GE(s, 1);
    EXPECT_LE(s, cd::kPermuteMaxSegments);
    EXPECT_EQ(len % 512, 0) << pairs;                // no run of 16 straddles two segments
    EXPECT_GE(s * len, pairs) << pairs;              // every pair in a segment
    EXPECT_LT((s - 1) * len, pairs) << pairs;        // none empty
    if (pairs <= cd::kPermuteMaxSegments * cd::kPermuteSegmentPairs)
      EXPECT_LE(len, cd::kPermuteSegmentPairs) << pairs;
    EXPECT_EQ(cd::permute_seg_words(pairs, 28), std::max<int64_t>(s, (pairs + 1023) / 1024) * 29) << pairs;
  }
}

// The block permutation (permute.cu permute_block_kernel) takes what the small form
// leaves, up to 64 local and 4096 global experts: one block up to 3072 pairs (Kimi top-16:
// 33 to 192 tokens), then co-resident blocks of one step each (Kimi M=1024: 16), more
// steps per block past 64 blocks (or fewer co-resident), up to 4 (Kimi M=16384: 64 blocks
// of 4), then the two kernels; its shared memory then fits the
// default 48 KB with the grid form's 1280 static bytes (the launcher opts in to nothing
// more), and the scratch holds every grid's counts.
TEST(Permute, BlockFormOneBlockThenCoresidentGridsUpToFourSteps) {
  using Plan = std::pair<int64_t, int>;
  auto plan = [](int64_t pairs, int el = 28, int64_t E = 896, int64_t coresident = 264, int one = 3,
                 int min_steps = 1) {
    const cd::BlockPermutePlan p = cd::block_permute_plan(pairs, el, E, coresident, one, min_steps);
    return Plan{p.blocks, p.steps};
  };
  EXPECT_EQ(plan(512), Plan(0, 0));  // the small form's
  EXPECT_EQ(plan(513), Plan(1, 1));
  EXPECT_EQ(plan(2048), Plan(1, 2));
  EXPECT_EQ(plan(3072), Plan(1, 3));
  EXPECT_EQ(plan(3073), Plan(4, 1));
  EXPECT_EQ(plan(16384), Plan(16, 1));
  EXPECT_EQ(plan(65536), Plan(64, 1));  // Kimi M=4096
  EXPECT_EQ(plan(65537), Plan(33, 2));
  EXPECT_EQ(plan(262144), Plan(64, 4));  // Kimi M=16384
  EXPECT_EQ(plan(262145), Plan(0, 0));  // the two kernels
  EXPECT_EQ(plan(30 * 1024, 28, 896, 20), Plan(15, 2));  // fewer co-resident than 64
  EXPECT_EQ(plan(80 * 1024 + 1, 28, 896, 20), Plan(0, 0));
  EXPECT_EQ(plan(4096, 64, 4096), Plan(4, 1));
  EXPECT_EQ(plan(4096, 65), Plan(0, 0));
  EXPECT_EQ(plan(1000, 28, 4097), Plan(0, 0));
  EXPECT_EQ(plan(520, 65), Plan(0, 0));  // (65 local: not the small form either)
  EXPECT_EQ(plan(16384, 28, 896, 3), Plan(0, 0));
  // The knobs: one block up to 4 steps, always a grid past one step, 2 steps at least.
  EXPECT_EQ(plan(4096, 28, 896, 264, 4), Plan(1, 4));
  EXPECT_EQ(plan(4097, 28, 896, 264, 4), Plan(5, 1));
  EXPECT_EQ(plan(1025, 28, 896, 264, 0), Plan(2, 1));
  EXPECT_EQ(plan(1024, 28, 896, 264, 0), Plan(1, 1));
  EXPECT_EQ(plan(16384, 28, 896, 264, 3, 2), Plan(8, 2));
  EXPECT_EQ(plan(16384, 28, 896, 264, 3, 3), Plan(6, 3));
  for (int64_t pairs = 513; pairs <= int64_t{264} * 4096; pairs = pairs * 9 / 8 + 97)
    for (int el : {1, 8, 28, 63, 64})
      for (int64_t E : {int64_t{el}, int64_t{896}, int64_t{4096}}) {
        const cd::BlockPermutePlan p = cd::block_permute_plan(pairs, el, E, 264);
        EXPECT_EQ(p.blocks == 0, pairs > cd::kBlockPermuteMaxBlocks * cd::kBlockPermutePairs) << pairs;
        if (p.blocks == 0) continue;
        EXPECT_LE(p.blocks, cd::kBlockPermuteMaxBlocks);
        EXPECT_GE(p.blocks * p.steps * cd::kBlockPermuteThreads, pairs) << pairs;  // every pair in a block
        EXPECT_LT((p.blocks - 1) * p.steps * cd::kBlockPermuteThreads, pairs) << pairs;  // none empty
        EXPECT_LE(cd::block_permute_smem_bytes(p.steps, el, E) + 1280, cd::kDefaultSmemBytes) << pairs << " " << el;
        if (p.blocks > 1) EXPECT_GE(cd::permute_seg_words(pairs, el), p.blocks * (el + 1)) << pairs;
      }
  // Kimi at 128 tokens: 2 steps x 32 warps x 28 experts of 16-bit counts, 2048 rows, the map.
  EXPECT_EQ(cd::block_permute_smem_bytes(2, 28, 896), 2 * 32 * 28 * 2 + 2048 * 4 + 896);
}

TEST(StageFp8, ScatteredFromOneThousandTwentyFourTokensSplitForOneLoadBatchAndTwoThousandWarps) {
  EXPECT_FALSE(cd::use_scattered_x_staging(512, -1));
  EXPECT_FALSE(cd::use_scattered_x_staging(1023, -1));
  EXPECT_TRUE(cd::use_scattered_x_staging(1024, -1));
  EXPECT_TRUE(cd::use_scattered_x_staging(128, 1));  // MXMOE_F8_SCATTER=1
  EXPECT_FALSE(cd::use_scattered_x_staging(4096, 0));
  // Kimi's x: 3584 columns, 28 groups, so at most 7 warps per token (a pass of 4 groups each).
  // 7 passes take 2 warps' single batches of loads (kStageFp8Passes = 4).
  EXPECT_EQ(cd::stage_fp8_split(128, 28), 7);
  EXPECT_EQ(cd::stage_fp8_split(512, 28), 4);
  EXPECT_EQ(cd::stage_fp8_split(1024, 28), 2);
  EXPECT_EQ(cd::stage_fp8_split(2048, 28), 2);
  EXPECT_EQ(cd::stage_fp8_split(4096, 28), 2);
  EXPECT_EQ(cd::stage_fp8_split(100000, 28), 2);
  EXPECT_EQ(cd::stage_fp8_split(4096, 57), 4);  // 15 passes
  EXPECT_EQ(cd::stage_fp8_split(4096, 16), 1);  // 4 passes: one batch
  // MXMOE_F8_SPLIT: n warps per token, still at most one per pass.
  EXPECT_EQ(cd::stage_fp8_split(1024, 28, 7), 7);
  EXPECT_EQ(cd::stage_fp8_split(1024, 28, 2), 2);
  EXPECT_EQ(cd::stage_fp8_split(4096, 28, 64), 7);
  EXPECT_EQ(cd::stage_fp8_split(1024, 28, 1), 1);
  EXPECT_EQ(cd::stage_fp8_split(1024, 28, -1), 2);
  for (const int64_t tokens : {1, 3, 100, 700, 5000, 100000})
    for (const int64_t groups : {1, 2, 5, 28, 57}) {
      const int s = cd::stage_fp8_split(tokens, groups);
      EXPECT_GE(s, 1);
      EXPECT_LE(s, (groups + 3) / 4) << tokens << " " << groups;
      EXPECT_TRUE(s == (groups + 3) / 4 || tokens * s >= 2048) << tokens << " " << groups;  // warps enough
      EXPECT_LE((groups + 3) / 4, s * cd::kStageFp8Passes) << tokens << " " << groups;  // one batch each
    }
}

}  // namespace
