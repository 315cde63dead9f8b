// One contrastive problem (q, k, optional labels, s, dloss) run forward and
// backward through the C API, and bitwise comparison of two runs' outputs:
// what the determinism and logit-cache tests compare, with no tolerance.
#pragma once

#include <flatmem/flatmem.h>

#include <cstddef>
#include <cstdint>

#include "support/contrastive.hpp"
#include "support/tensor.hpp"

namespace flatmem_test {

struct BitwiseCase {
  flatmem_contrastive_loss loss = FLATMEM_CONTRASTIVE_SYMMETRIC;
  Dtype dtype = Dtype::f32;
  std::int64_t b = 0, c = 0, d = 0;
  int tile_rows = 0, tile_cols = 0;
  bool labels = false;
  Dtype grad = Dtype::f32;
  double scale = 20.0;
};

struct Results {
  HostTensor loss, row_lse, col_lse, dq, dk, ds;
};

class BitwiseProblem {
 public:
  explicit BitwiseProblem(const BitwiseCase &bc, std::uint64_t seed = 7);

  bool symmetric() const { return bc_.loss != FLATMEM_CONTRASTIVE_INFONCE; }
  flatmem_contrastive_options options(int threads, std::size_t logit_cache_bytes = 0) const;

  // Forward then backward on a fresh handle.
  Results run(int threads, std::size_t logit_cache_bytes = 0) const;
  // The two calls on a given handle (REQUIREs success); backward reads r's
  // row_lse / col_lse and fills r's gradients.
  void forward(flatmem_contrastive_t *h, Results &r) const;
  void backward(flatmem_contrastive_t *h, Results &r) const;

  // Changes one element of q (row `row`, column 0) by one step of its dtype.
  void nudge_q(std::int64_t row);
  HostTensor &q() { return q_; }

 private:
  BitwiseCase bc_;
  HostTensor q_, k_, labels_, scale_, dloss_;
};

// CHECKs every output of a and b for identical bits.
void check_identical(const Results &a, const Results &b, bool symmetric);

}  // namespace flatmem_test
