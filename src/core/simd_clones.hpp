// FLATMEM_SIMD_CLONES: function multiversioning for hot element-wise loops.
// Compiled for AVX-512, AVX2 and baseline x86-64; the loader picks one clone
// per machine through an ifunc. Off for non-GCC compilers, with
// -DFLATMEM_NO_CLONES, and under ThreadSanitizer (the ifunc resolvers run
// while the loader relocates the library, before TSan's runtime is up, and
// crash there when instrumented).
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(FLATMEM_NO_CLONES) && !defined(__SANITIZE_THREAD__)
#define FLATMEM_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define FLATMEM_SIMD_CLONES
#endif
