// extern "C" entry points of the built-in reversible blocks: argument checks,
// then the block object; exceptions become statuses (core/error.hpp).
#include "core/abi_struct.hpp"
#include "core/cpu_isa.hpp"
#include "core/error.hpp"
#include "reversible/blocks/block.hpp"
#include "reversible/blocks/options.hpp"

using namespace flatmem;

namespace {

void check_block(const flatmem_block_t *block) {
  if (block == nullptr) invalid("block: NULL (create one with flatmem_block_create)");
}
void check_out(const void *p, const char *name) {
  if (p == nullptr) invalid(name, ": NULL");
}

}  // namespace

extern "C" {

flatmem_status flatmem_block_options_init(flatmem_block_options *options, size_t struct_size) {
  return guarded([&] {
    init_struct(options, struct_size, flatmem_block_options FLATMEM_BLOCK_OPTIONS_INIT, "options");
  });
}

flatmem_status flatmem_block_create(flatmem_block_t **out, const flatmem_block_options *options) {
  return guarded([&] {
    check_out(out, "out");
    cpu_isa::active();  // FLATMEM_CPU_ISA asking for more than the CPU has: refused here
    const blocks::BlockOptions resolved = blocks::resolve_block_options(options);
    *out = new flatmem_block_s(resolved);
  });
}

flatmem_status flatmem_block_destroy(flatmem_block_t *block) {
  return guarded([&] { delete block; });
}

flatmem_status flatmem_block_set_parameters(flatmem_block_t *block, const DLTensor *parameters,
                                            const DLTensor *gradients) {
  return guarded([&] {
    check_block(block);
    blocks::set_parameters(*block, parameters, gradients);
  });
}

flatmem_status flatmem_block_function(flatmem_block_t *block, flatmem_reversible_function *function) {
  return guarded([&] {
    check_block(block);
    check_out(function, "function");
    *function = blocks::block_function(*block);
  });
}

}  // extern "C"
