// tensor_map.cu — TMA tensor maps: the prefill path's staged BF16 rows (wgmma_mx.cuh) and
// the FP8 mode's weight codes, staged token rows and their scales (wgmma_fp8.cuh).
// The encoder is a driver entry point, looked up through the runtime once, so the library
// still links only against the CUDA runtime.
#include <cudaTypedefs.h>

#include <mutex>

#include "common.cuh"
#include "wgmma_fp8.cuh"
#include "wgmma_mx.cuh"

namespace mxmoe::cuda_detail {

namespace {
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    MXMOE_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                                      cudaEnableDefault, &q));
    if (q == cudaDriverEntryPointSuccess) fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  });
  if (fn == nullptr) throw CudaError("cuTensorMapEncodeTiled is not available from the driver");
  return fn;
}

/// The one encoder call behind every map here: a 2-D map over `rows` rows of `row_elems`
/// elements of `type`, `row_bytes` apart, boxes of box_elems x box_rows, 128-byte swizzle
/// (the wgmma K-major layout; box_elems spans 128 bytes) unless `swizzle` is false, rows
/// and elements past the end read as zeros.
CUtensorMap tiled_rows_map(CUtensorMapDataType type, const void* base, int64_t row_elems, int64_t rows,
                              int64_t row_bytes, int box_elems, int box_rows, bool swizzle = true) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(row_elems), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(row_bytes)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_elems), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(
      &map, type, 2, const_cast<void*>(base), dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
      swizzle ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) throw CudaError(detail::cat("cuTensorMapEncodeTiled failed: CUresult ", static_cast<int>(r)));
  return map;
}
}  // namespace

CUtensorMap staged_rows_map(const uint16_t* rows, int64_t count, int64_t stride, int box_rows) {
  MXMOE_CHECK_ARG(rows != nullptr && count > 0 && count < (int64_t{1} << 31) && stride % 64 == 0 &&
                      stride > 0 && stride < (int64_t{1} << 31) && box_rows >= 1 && box_rows <= 256,
                  "staged rows", "need a buffer, 1 .. 2^31 - 1 rows, a stride that is a "
                  "positive multiple of 64 and boxes of 1 .. 256 rows (got ", count, " rows, stride ",
                  stride, ", box ", box_rows, ")");
  // 64 elements = 128 bytes per box row.
  return tiled_rows_map(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rows, stride, count, stride * 2, 64, box_rows);
}

CUtensorMap fp8_codes_map(const uint8_t* codes, int64_t rows, int64_t cols_p) {
  MXMOE_CHECK_ARG(codes != nullptr && rows > 0 && rows % kF8Rows == 0 && rows < (int64_t{1} << 31) &&
                      cols_p > 0 && cols_p % kF8Group == 0 && cols_p < (int64_t{1} << 31),
                  "FP8 weight codes", "need a buffer of whole 128-row blocks and 128-byte groups (got ",
                  rows, " rows of ", cols_p, " bytes)");
  // One group of one row block: 16 KB.
  return tiled_rows_map(CU_TENSOR_MAP_DATA_TYPE_UINT8, codes, cols_p, rows, cols_p, kF8Group, kF8Rows);
}

CUtensorMap fp8_staged_rows_map(const uint8_t* rows, int64_t count, int64_t cols_p) {
  MXMOE_CHECK_ARG(rows != nullptr && count > 0 && count < (int64_t{1} << 31) && cols_p > 0 &&
                      cols_p % kF8Group == 0 && cols_p < (int64_t{1} << 31),
                  "FP8 staged rows", "need a buffer, 1 .. 2^31 - 1 rows and whole 128-byte groups (got ",
                  count, " rows of ", cols_p, " bytes)");
  // One group of one 128-token tile: 16 KB.
  return tiled_rows_map(CU_TENSOR_MAP_DATA_TYPE_UINT8, rows, cols_p, count, cols_p, kF8Group, kPfTokens);
}

CUtensorMap fp8_token_scales_map(const float* scales, int64_t count, int64_t groups) {
  const int64_t scale_rows = fp8_scale_rows(count);
  MXMOE_CHECK_ARG(scales != nullptr && count > 0 && scale_rows < (int64_t{1} << 31) && groups > 0 &&
                      groups < (int64_t{1} << 31),
                  "FP8 token scales", "need a buffer, 1 .. 2^31 - 4 rows and 1 .. 2^31 - 1 groups (got ",
                  count, " rows, ", groups, " groups)");
  // A group's row of fp8_scale_rows(count) floats per map row; one tile's 128 scales of one
  // group per box, from the multiple of 4 rows at or below the tile's first (528 bytes,
  // kF8TokenScaleBox; no swizzle: the consumers read them by LDS).
  return tiled_rows_map(CU_TENSOR_MAP_DATA_TYPE_FLOAT32, scales, scale_rows, groups, scale_rows * 4,
                           kF8TokenScaleBox, 1, /*swizzle=*/false);
}

}  // namespace mxmoe::cuda_detail
