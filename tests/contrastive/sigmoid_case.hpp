// One sigmoid-loss problem for the tests: inputs (random features of a dtype,
// optional labels, s, t), the three calls of the C API on them, and the
// matching double reference problem (tests/contrastive/sigmoid_reference.hpp).
#pragma once

#include <flatmem/flatmem.h>

#include <cstdint>

#include "contrastive/sigmoid_reference.hpp"
#include "support/contrastive.hpp"
#include "support/tensor.hpp"

namespace flatmem_test {

struct SigmoidShape {
  std::int64_t b = 1, c = 1, d = 1;
  bool labels = false;  // random labels in [0, c) (else y_i = i)
  double scale = 10.0, bias = -10.0;
  Dtype dtype = Dtype::f32;
  Dtype grad_dtype = Dtype::f32;  // dq, dk outputs: fp32 or the input dtype
  double sigma = 1.0;             // features N(0, sigma^2), rows of unit norm when unit_rows
  bool unit_rows = true;
  std::uint64_t seed = 1;
};

// Outputs of one call (prefilled with sentinel bytes).
struct SigmoidOutputs {
  HostTensor loss, dq, dk, ds, dt;
};

class SigmoidCase {
 public:
  explicit SigmoidCase(const SigmoidShape &shape);
  // Given inputs (shape.b, shape.c, shape.d must match them; labels empty
  // unless shape.labels); s and t from the shape.
  SigmoidCase(const SigmoidShape &shape, HostTensor q, HostTensor k, HostTensor labels);

  // The calls, on `handle` (created with FLATMEM_CONTRASTIVE_SIGMOID). want_*
  // false passes NULL for that output. Workspace: the handle's own buffer.
  flatmem_status forward(flatmem_contrastive_t *handle, SigmoidOutputs &out) const;
  flatmem_status value_and_grad(flatmem_contrastive_t *handle, SigmoidOutputs &out,
                                bool want_loss = true, bool want_dq = true, bool want_dk = true,
                                bool want_ds = true, bool want_dt = true) const;
  flatmem_status backward(flatmem_contrastive_t *handle, double dloss, SigmoidOutputs &out) const;

  // Fresh outputs, every byte sentinel_byte.
  SigmoidOutputs outputs() const;
  // The reference problem (g = dloss) of these inputs, with s and t replaced
  // when given (finite differences); s and t as the fp32 values passed.
  SigmoidProblem problem(double dloss = 1.0) const;

  SigmoidShape shape;
  HostTensor q, k, labels, scale, bias;
};

// Checks every output of `out` that holds values (loss, dq, dk, ds, dt as
// flags say) against the reference within sigmoid_tolerance.
struct SigmoidChecks {
  bool loss = true, dq = true, dk = true, ds = true, dt = true;
};
void check_against_reference(const SigmoidCase &c, const SigmoidOutputs &out, double dloss,
                             SigmoidChecks which = {});

// Creates a SIGMOID handle (threads, tiles; 0 = default).
Handle sigmoid_handle(int threads = 0, int tile_rows = 0, int tile_cols = 0,
                      flatmem_nonfinite_policy nonfinite = FLATMEM_NONFINITE_ERROR);

}  // namespace flatmem_test
