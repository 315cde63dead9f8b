// amx_tile_ops.hpp's interface on the AMX instructions. Include it only
// where AMX-TILE and AMX-BF16 are enabled (a `#pragma GCC target` region or
// -mamx-tile -mamx-bf16): the intrinsics compile nowhere else. Run it only
// where cpu_isa reports amx (the process has the kernel's permission for tile
// data, asked by cpu_isa::amx_usable()).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "contrastive/cpu/amx_tile_ops.hpp"

namespace flatmem::contrastive::cpu::amx {

// GCC's _tile_* macros paste their tile argument into the assembly text, so
// each tile number is spelled out (a template argument would not be).
#define FLATMEM_AMX_EACH_TILE(op) \
  if constexpr (t == 0) op(0);    \
  else if constexpr (t == 1) op(1); \
  else if constexpr (t == 2) op(2); \
  else if constexpr (t == 3) op(3); \
  else if constexpr (t == 4) op(4); \
  else if constexpr (t == 5) op(5); \
  else if constexpr (t == 6) op(6); \
  else op(7)

struct HardwareTiles {
  static void configure() {
    static constexpr TileConfig config = full_tiles();  // constant-initialised: all 64 bytes in memory
    _tile_loadconfig(&config);
  }
  static void release() { _tile_release(); }
  template <int t>
  static void zero() {
#define FLATMEM_AMX_ZERO(n) _tile_zero(n)
    FLATMEM_AMX_EACH_TILE(FLATMEM_AMX_ZERO);
#undef FLATMEM_AMX_ZERO
  }
  // GCC's _tile_loadd is an asm without a memory operand or clobber: the
  // compiler would be free to keep the packing's stores to `base` pending past
  // it. The empty asm with a "memory" clobber makes them land first.
  template <int t>
  static void load(const void *base, std::int64_t stride) {
    __asm__ volatile("" ::: "memory");
#define FLATMEM_AMX_LOAD(n) _tile_loadd(n, base, stride)
    FLATMEM_AMX_EACH_TILE(FLATMEM_AMX_LOAD);
#undef FLATMEM_AMX_LOAD
  }
  template <int t>
  static void store(void *base, std::int64_t stride) {
#define FLATMEM_AMX_STORE(n) _tile_stored(n, base, stride)
    FLATMEM_AMX_EACH_TILE(FLATMEM_AMX_STORE);
#undef FLATMEM_AMX_STORE
  }
  // The four products the kernels issue: C tiles 0-3 from A tiles 4-5 and B tiles 6-7.
  template <int c, int a, int b>
  static void dot() {
    static_assert(a == 4 + c / 2 && b == 6 + c % 2, "C tile c takes A tile 4 + c / 2 and B tile 6 + c % 2");
    if constexpr (c == 0) _tile_dpbf16ps(0, 4, 6);
    else if constexpr (c == 1) _tile_dpbf16ps(1, 4, 7);
    else if constexpr (c == 2) _tile_dpbf16ps(2, 5, 6);
    else _tile_dpbf16ps(3, 5, 7);
  }
};
#undef FLATMEM_AMX_EACH_TILE

}  // namespace flatmem::contrastive::cpu::amx
