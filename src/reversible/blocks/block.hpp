// The built-in block object behind flatmem_block_t: its resolved options and
// the parameter / gradient tensors it was pointed at (data pointers only; the
// caller keeps the memory, flatmem_block_set_parameters checked the shapes).
#pragma once

#include <flatmem/flatmem.h>

#include "reversible/blocks/options.hpp"
#include "reversible/blocks/shape.hpp"

struct flatmem_block_s {
  explicit flatmem_block_s(const flatmem::blocks::BlockOptions &o) : options(o) {}

  const flatmem::blocks::BlockOptions options;
  flatmem::blocks::BlockParameters parameters;
  DLDevice device{kDLCPU, 0};  // of every parameter and gradient
  bool has_parameters = false;
  bool has_gradients = false;
};

namespace flatmem::blocks {

// Checks parameters[0..5] (required) and gradients[0..5] (NULL allowed)
// against the block's shapes -- fp32, compact, all on one device (kDLCPU, or
// kDLCUDA memory of one device in CUDA builds) -- then points the block at
// them. On error the block is unchanged.
void set_parameters(flatmem_block_s &block, const DLTensor *parameters, const DLTensor *gradients);

// The block's forward / vjp / residual_size callbacks.
flatmem_reversible_function block_function(flatmem_block_s &block);

}  // namespace flatmem::blocks
