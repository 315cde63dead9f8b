// Workspace promises of flatmem.h: the size queries read metadata only, the
// memory beyond inputs and outputs is
//   O(tile_rows * tile_cols * threads + (tile_rows + tile_cols) * d * threads + b + c)
// (never O(b * c), never an fp32 copy of 16-bit inputs), 16-bit gradients add
// exactly their (b + c) * d * 4-byte fp32 accumulators, and the handle's own
// buffer (workspace NULL) grows on demand and is reused across shapes.
#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "support/contrastive.hpp"
#include "support/random.hpp"
#include "support/tensor.hpp"

using namespace flatmem_test;

namespace {

constexpr auto SYM = FLATMEM_CONTRASTIVE_SYMMETRIC;
constexpr auto NCE = FLATMEM_CONTRASTIVE_INFONCE;

// A metadata-only matrix (data NULL), as the size queries allow.
struct Shape {
  Shape(std::int64_t rows, std::int64_t cols, Dtype dtype = Dtype::f32) {
    extent[0] = rows;
    extent[1] = cols;
    t.data = nullptr;
    t.device = {kDLCPU, 0};
    t.ndim = 2;
    t.dtype = dl_dtype(dtype);
    t.shape = extent;
    t.strides = nullptr;
    t.byte_offset = 0;
  }
  std::int64_t extent[2];
  DLTensor t{};
};

std::size_t forward_bytes(flatmem_contrastive_t *h, std::int64_t b, std::int64_t c, std::int64_t d,
                          Dtype dtype = Dtype::f32) {
  Shape q(b, d, dtype), k(c, d, dtype);
  std::size_t bytes = 0;
  const flatmem_status status = flatmem_contrastive_forward_workspace_size(h, &q.t, &k.t, &bytes);
  REQUIRE_MESSAGE(status == FLATMEM_STATUS_SUCCESS, describe(status));
  return bytes;
}

}  // namespace

TEST_CASE("contrastive/workspace/forward-grows-like-b+c-not-b*c") {
  // 256 x 256 tiles (set explicitly; the library shrinks tiles only for
  // extents below 4 tiles): doubling b = c must add the same amount each time
  // (linear), and a small amount per row (the O(b + c) running statistics),
  // where an O(b * c) buffer would add megabytes.
  Handle h = create_handle(make_options(SYM, 2, 256, 256));
  const std::size_t s1 = forward_bytes(h.get(), 1024, 1024, 64), s2 = forward_bytes(h.get(), 2048, 2048, 64),
                    s4 = forward_bytes(h.get(), 4096, 4096, 64);
  INFO("sizes ", s1, ", ", s2, ", ", s4);
  CHECK(s2 > s1);
  // linear up to the per-group partial sums (at most 16 groups of a few
  // doubles, each region aligned to 64 bytes)
  const double excess = double(s4 - s2) - 2.0 * double(s2 - s1);
  CHECK(std::fabs(excess) <= 1024.0);
  CHECK((s2 - s1) / (1024 + 1024) <= 64);  // bytes per added row and column
  // InfoNCE keeps no column statistics: growing c alone costs nothing beyond
  // what the tiles need.
  Handle n = create_handle(make_options(NCE, 2, 256, 256));
  CHECK(forward_bytes(n.get(), 1024, 8192, 64) == forward_bytes(n.get(), 1024, 4096, 64));
}

TEST_CASE("contrastive/workspace/forward-tile-term-is-per-thread") {
  // O(tile_rows * tile_cols * threads + (tile_rows + tile_cols) * d * threads):
  // at a fixed shape the size grows with the thread count by at most one
  // thread's tiles (16-bit inputs: plus their widened rows).
  const std::int64_t b = 4096, d = 512;
  for (Dtype dtype : {Dtype::f32, Dtype::bf16}) {
    CAPTURE(dtype_name(dtype));
    Handle one = create_handle(make_options(SYM, 1, 256, 256)), three = create_handle(make_options(SYM, 3, 256, 256));
    const std::size_t s1 = forward_bytes(one.get(), b, b, d, dtype), s3 = forward_bytes(three.get(), b, b, d, dtype);
    // tile + widened rows + the tile kernels' row/column vectors (R + 2C floats)
    // + positive slots and alignment
    const std::size_t per_thread =
        256 * 256 * 4 + (256 + 256) * std::size_t(d) * 4 + (256 + 2 * 256) * 4 + 4096;
    CHECK(s3 > s1);
    CHECK(s3 - s1 <= 2 * per_thread);
  }
}

TEST_CASE("contrastive/workspace/16-bit-inputs-are-not-copied-to-fp32") {
  // "bf16/fp16 tiles are widened tile by tile (no fp32 copy of the inputs)":
  // 16-bit inputs may need widened tile rows, never b * d fp32 values.
  const std::int64_t b = 1 << 16, d = 1024;
  Handle h = create_handle(make_options(SYM, 2, 256, 256));
  const std::size_t fp32 = forward_bytes(h.get(), b, b, d, Dtype::f32);
  for (Dtype dtype : {Dtype::bf16, Dtype::f16}) {
    CAPTURE(dtype_name(dtype));
    const std::size_t narrow = forward_bytes(h.get(), b, b, d, dtype);
    const std::size_t widened_tiles = 2 * (256 + 256) * std::size_t(d) * 4 + 4096;  // two threads
    CHECK(narrow <= fp32 + widened_tiles);
    CHECK(narrow < std::size_t(b) * std::size_t(d) * 4 / 8);
  }
}

TEST_CASE("contrastive/workspace/backward-16-bit-gradients-add-fp32-accumulators") {
  // dq and dk in the input's 16-bit dtype are accumulated in fp32 buffers of
  // b * d and c * d floats inside the workspace: the size differs from the
  // fp32-gradient size by exactly those (up to 64-byte alignment), and a
  // gradient not requested (NULL) needs no accumulator.
  Handle h = create_handle(make_options(NCE, 2));
  const std::int64_t b = 1000, c = 3000, d = 96;
  Shape q(b, d, Dtype::bf16), k(c, d, Dtype::bf16);
  Shape dq16(b, d, Dtype::bf16), dk16(c, d, Dtype::bf16), dq32(b, d, Dtype::f32), dk32(c, d, Dtype::f32);
  const auto size = [&](const DLTensor *dq, const DLTensor *dk) {
    std::size_t bytes = 0;
    const flatmem_status status = flatmem_contrastive_backward_workspace_size(h.get(), &q.t, &k.t, dq, dk, &bytes);
    REQUIRE_MESSAGE(status == FLATMEM_STATUS_SUCCESS, describe(status));
    return bytes;
  };
  const std::size_t none = size(nullptr, nullptr), wide = size(&dq32.t, &dk32.t);
  const std::size_t narrow_q = size(&dq16.t, &dk32.t), narrow_k = size(&dq32.t, &dk16.t),
                    narrow = size(&dq16.t, &dk16.t);
  const std::size_t acc_q = std::size_t(b * d) * 4, acc_k = std::size_t(c * d) * 4;
  INFO("none ", none, ", fp32 ", wide, ", dq16 ", narrow_q, ", dk16 ", narrow_k, ", both ", narrow);
  CHECK(wide == none);  // fp32 gradients accumulate in place
  CHECK(narrow_q - wide >= acc_q);
  CHECK(narrow_q - wide <= acc_q + 64);
  CHECK(narrow_k - wide >= acc_k);
  CHECK(narrow_k - wide <= acc_k + 64);
  CHECK(narrow - wide >= acc_q + acc_k);
  CHECK(narrow - wide <= acc_q + acc_k + 128);
  CHECK(size(&dq16.t, nullptr) - none >= acc_q);
  CHECK(size(nullptr, &dk16.t) - none >= acc_k);
}

TEST_CASE("contrastive/workspace/query-ignores-data-and-strides-of-the-values") {
  // The query reads device, dtype, ndim and shape: NULL data or real data,
  // the size is the same.
  Handle h = create_handle(make_options(SYM, 2, 16, 24));
  HostTensor q = HostTensor::matrix(Dtype::f32, 97, 13), k = HostTensor::matrix(Dtype::f32, 97, 13);
  std::size_t with_data = 0;
  REQUIRE(flatmem_contrastive_forward_workspace_size(h.get(), q.dl(), k.dl(), &with_data) == FLATMEM_STATUS_SUCCESS);
  CHECK(forward_bytes(h.get(), 97, 97, 13) == with_data);
}

TEST_CASE("contrastive/workspace/handle-buffer-grows-and-is-reused-across-shapes") {
  // With workspace NULL the handle keeps and grows its own buffer: a handle
  // used for a small, a large, then a small problem again gives exactly the
  // bits of fresh handles.
  const auto run = [](flatmem_contrastive_t *h, std::int64_t b, std::int64_t d) {
    Random rng(std::uint64_t(b * 1000 + d));
    HostTensor q = HostTensor::matrix(Dtype::bf16, b, d), k = HostTensor::matrix(Dtype::bf16, b, d);
    fill_features(q, rng, 1.0, true);
    fill_features(k, rng, 1.0, true);
    HostTensor s = HostTensor::scalar(Dtype::f32, 10.0), loss = HostTensor::scalar(Dtype::f32, 0.0);
    HostTensor row = HostTensor::vector(Dtype::f32, b), col = HostTensor::vector(Dtype::f32, b);
    HostTensor dq = HostTensor::matrix(Dtype::bf16, b, d), dk = HostTensor::matrix(Dtype::bf16, b, d);
    REQUIRE(flatmem_contrastive_forward(h, q.dl(), k.dl(), nullptr, s.dl(), loss.dl(), row.dl(), col.dl(), nullptr,
                                        0, nullptr) == FLATMEM_STATUS_SUCCESS);
    REQUIRE(flatmem_contrastive_backward(h, q.dl(), k.dl(), nullptr, s.dl(), row.dl(), col.dl(), nullptr, dq.dl(),
                                         dk.dl(), nullptr, nullptr, 0, nullptr) == FLATMEM_STATUS_SUCCESS);
    std::vector<std::uint64_t> bits{loss.bits(0, 0)};
    for (const HostTensor *t : {&row, &col, &dq, &dk})
      for (std::int64_t r = 0; r < t->rows(); ++r)
        for (std::int64_t c = 0; c < t->cols(); ++c) bits.push_back(t->bits(r, c));
    return bits;
  };
  Handle reused = create_handle(make_options(SYM, 1));
  for (auto [b, d] : {std::pair<std::int64_t, std::int64_t>{13, 7}, {263, 97}, {5, 3}, {300, 40}}) {
    CAPTURE(b);
    CAPTURE(d);
    Handle fresh = create_handle(make_options(SYM, 1));
    CHECK(run(reused.get(), b, d) == run(fresh.get(), b, d));
  }
}
