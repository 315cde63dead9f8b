// The BLAS behind the CPU tile products. flatmem runs tiles on its own threads
// and calls sgemm once per tile from each, so every call must run on the
// calling thread alone.
#pragma once

namespace flatmem {

// Idempotent and thread-safe; call before the first sgemm. With the private
// OpenBLAS (FLATMEM_BLAS=PRIVATE_OPENBLAS) it sets that copy -- and only it,
// its symbols are hidden inside libflatmem -- to one thread per call. With a
// system BLAS it changes nothing: the host owns that BLAS's settings.
void prepare_blas();

}  // namespace flatmem
