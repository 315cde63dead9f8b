// Helpers shared by the contrastive-loss targets (fuzz_contrastive, fuzz_sigmoid): the
// handle options a hostile caller fills, hostile scalar values, and the checks on outputs
// after a call (untouched after a failure, finite after a trusted success).
#pragma once

#include <cstdint>
#include <initializer_list>

#include <flatmem/flatmem.h>

#include "support/fuzz_input.hpp"
#include "support/fuzz_tensor.hpp"

namespace flatmem_fuzz {

// table[choice] when choice indexes it, else a hostile int32 from the reader.
std::int32_t pick_int32(Reader &in, std::uint8_t choice, std::initializer_list<std::int32_t> table);

// One plan byte per field of flatmem_contrastive_options (0 = the ordinary choice); `losses`
// is the table the loss byte indexes.
struct ContrastiveOptionBytes {
  std::uint8_t loss, threads, tile_rows, tile_cols, nonfinite, precision, cache, struct_size;
};
flatmem_contrastive_options contrastive_options(Reader &in, const ContrastiveOptionBytes &bytes,
                                                std::initializer_list<std::int32_t> losses);

// The loss a handle created from `options` (NULL: defaults) computes.
flatmem_contrastive_loss effective_loss(const flatmem_contrastive_options *options);

// A logit scale as callers pass it: choice % 9 < 3 gives a finite value > 0 (1, 10, 100);
// then 0, -1, 1e-30, NaN, Inf, a byte / 16.
float scale_value(Reader &in, std::uint8_t choice);

// Outputs must be untouched after a failure.
void expect_unwritten(const char *call, std::initializer_list<const FuzzTensor *> outputs);
// Every element of an honest fp32 output finite.
void expect_finite(const char *call, const FuzzTensor &t, const char *name);

}  // namespace flatmem_fuzz
