// Function multiversioning for the element-wise loops of the blocks (as in
// contrastive/cpu/tile_math.cpp): AVX-512, AVX2 and baseline x86-64 clones,
// the loader picks one per machine. All clones of a function give the same
// bits on one machine, run after run.
#pragma once

#include "core/simd_clones.hpp"

#define FLATMEM_BLOCK_SIMD FLATMEM_SIMD_CLONES
