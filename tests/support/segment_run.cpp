#include "support/segment_run.hpp"

#include <doctest/doctest.h>

#include <cstring>

#include "support/random.hpp"

namespace flatmem_test {
namespace {

HostTensor random_matrix(Dtype dtype, std::int64_t rows, std::int64_t width, Random &rng) {
  HostTensor t = HostTensor::matrix(dtype, rows, width);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < width; ++c) t.set(r, c, rng.normal());
  return t;
}

HostTensor like(const HostTensor &t) { return HostTensor::matrix(t.dtype(), t.rows(), t.cols()); }

}  // namespace

SegmentInputs::SegmentInputs(Dtype dtype, std::int64_t rows, std::int64_t width, std::uint64_t seed) {
  Random rng(seed);
  x1 = random_matrix(dtype, rows, width, rng);
  x2 = random_matrix(dtype, rows, width, rng);
  dy1 = random_matrix(dtype, rows, width, rng);
  dy2 = random_matrix(dtype, rows, width, rng);
}

SegmentRun run_segment(ToySegment &segment, const SegmentInputs &in, const SegmentSettings &s) {
  SegmentRun run;
  run.y1 = like(in.x1);
  run.y2 = like(in.x1);
  run.dx1 = like(in.x1);
  run.dx2 = like(in.x1);
  run.x1 = like(in.x1);
  run.x2 = like(in.x1);
  flatmem_reversible_options options = FLATMEM_REVERSIBLE_OPTIONS_INIT;
  options.mode = s.mode;
  options.num_threads = s.threads;
  flatmem_reversible_t *h = nullptr;
  REQUIRE(flatmem_reversible_create(&h, segment.blocks.data(), int32_t(segment.blocks.size()),
                                    &options) == FLATMEM_STATUS_SUCCESS);
  segment.zero_gradients();
  run.forward_status = flatmem_reversible_forward(h, in.x1.dl(), in.x2.dl(), s.seed, s.offset,
                                                  run.y1.dl(), run.y2.dl(), nullptr, 0, nullptr);
  for (int i = 0; i < s.backwards && run.forward_status == FLATMEM_STATUS_SUCCESS; ++i) {
    segment.zero_gradients();
    run.backward_status = flatmem_reversible_backward(
        h, run.y1.dl(), run.y2.dl(), in.dy1.dl(), in.dy2.dl(), s.seed, s.offset + s.backward_offset_shift, run.dx1.dl(),
        run.dx2.dl(), run.x1.dl(), run.x2.dl(), nullptr, 0, nullptr);
  }
  REQUIRE(flatmem_reversible_last_mode(h, &run.ran) == FLATMEM_STATUS_SUCCESS);
  for (std::size_t k = 0; k < segment.blocks.size(); ++k) {
    run.d_weight_f.push_back(segment.f[k]->d_weight);
    run.d_bias_f.push_back(segment.f[k]->d_bias);
    run.d_weight_g.push_back(segment.g[k]->d_weight);
    run.d_bias_g.push_back(segment.g[k]->d_bias);
  }
  flatmem_reversible_destroy(h);
  return run;
}

bool same_bits(const SegmentRun &a, const SegmentRun &b) {
  auto same_vectors = [](const std::vector<std::vector<double>> &p,
                         const std::vector<std::vector<double>> &q) {
    if (p.size() != q.size()) return false;
    for (std::size_t i = 0; i < p.size(); ++i)
      if (p[i].size() != q[i].size() ||
          std::memcmp(p[i].data(), q[i].data(), p[i].size() * sizeof(double)) != 0)
        return false;
    return true;
  };
  return a.y1.same_bits(b.y1) && a.y2.same_bits(b.y2) && a.dx1.same_bits(b.dx1) &&
         a.dx2.same_bits(b.dx2) && a.x1.same_bits(b.x1) && a.x2.same_bits(b.x2) &&
         same_vectors(a.d_weight_f, b.d_weight_f) && same_vectors(a.d_bias_f, b.d_bias_f) &&
         same_vectors(a.d_weight_g, b.d_weight_g) && same_vectors(a.d_bias_g, b.d_bias_g);
}

}  // namespace flatmem_test
