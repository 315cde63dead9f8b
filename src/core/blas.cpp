#include "core/blas.hpp"

#include <mutex>

#ifdef FLATMEM_PRIVATE_OPENBLAS
extern "C" void openblas_set_num_threads(int);
#endif

namespace flatmem {

void prepare_blas() {
#ifdef FLATMEM_PRIVATE_OPENBLAS
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
#endif
}

}  // namespace flatmem
