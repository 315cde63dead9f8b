// Function multiversioning for the element-wise loops of the blocks (as in
// contrastive/cpu/tile_math.cpp): AVX-512, AVX2 and baseline x86-64 clones,
// the loader picks one per machine. All clones of a function give the same
// bits on one machine, run after run.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(FLATMEM_NO_CLONES)
#define FLATMEM_BLOCK_SIMD __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define FLATMEM_BLOCK_SIMD
#endif
