#include "core/cuda/cublaslt_library.hpp"

#include <string>

#include "core/dynamic_library.hpp"
#include "core/error.hpp"

#ifndef FLATMEM_CUBLASLT_CONFIGURED_PATH
#define FLATMEM_CUBLASLT_CONFIGURED_PATH ""
#endif

namespace flatmem::cuda::lt {
namespace {

struct Loaded {
  Api api{};
  flatmem_status status = FLATMEM_STATUS_SUCCESS;
  std::string message;  // why it cannot be used (status != SUCCESS)
};

Loaded load() {
  Loaded out;
  const std::string soname = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
  const OpenedLibrary library = open_first_library(
      "FLATMEM_CUBLASLT_LIBRARY", {soname, FLATMEM_CUBLASLT_CONFIGURED_PATH});
  if (library.handle == nullptr) {
    out.status = FLATMEM_STATUS_UNSUPPORTED;
    out.message = "the cuBLASLt library cannot be loaded (tried " + library.tried + "); install cuBLAS " +
                  std::to_string(CUBLAS_VER_MAJOR) + " or set FLATMEM_CUBLASLT_LIBRARY to " + soname;
    return out;
  }
  Api &a = out.api;
  a.where = library.where;
  void *h = library.handle;
  std::string missing;
  bind_symbol(h, "cublasLtGetVersion", a.GetVersion, missing);
  bind_symbol(h, "cublasLtGetStatusString", a.GetStatusString, missing);
  bind_symbol(h, "cublasLtCreate", a.Create, missing);
  bind_symbol(h, "cublasLtMatmulDescCreate", a.MatmulDescCreate, missing);
  bind_symbol(h, "cublasLtMatmulDescDestroy", a.MatmulDescDestroy, missing);
  bind_symbol(h, "cublasLtMatmulDescSetAttribute", a.MatmulDescSetAttribute, missing);
  bind_symbol(h, "cublasLtMatrixLayoutCreate", a.MatrixLayoutCreate, missing);
  bind_symbol(h, "cublasLtMatrixLayoutDestroy", a.MatrixLayoutDestroy, missing);
  bind_symbol(h, "cublasLtMatrixLayoutSetAttribute", a.MatrixLayoutSetAttribute, missing);
  bind_symbol(h, "cublasLtMatmulPreferenceCreate", a.MatmulPreferenceCreate, missing);
  bind_symbol(h, "cublasLtMatmulPreferenceDestroy", a.MatmulPreferenceDestroy, missing);
  bind_symbol(h, "cublasLtMatmulPreferenceSetAttribute", a.MatmulPreferenceSetAttribute, missing);
  bind_symbol(h, "cublasLtMatmulAlgoGetHeuristic", a.MatmulAlgoGetHeuristic, missing);
  bind_symbol(h, "cublasLtMatmul", a.Matmul, missing);
  if (!missing.empty()) {
    out.status = FLATMEM_STATUS_UNSUPPORTED;
    out.message = a.where + " is not a usable cuBLASLt (missing: " + missing + ")";
    return out;
  }
  a.version = a.GetVersion();
  // cublasLtGetVersion: major * 10000 + minor * 100 + patch.
  if (a.version / 10000 != CUBLAS_VER_MAJOR) {
    out.status = FLATMEM_STATUS_UNSUPPORTED;
    out.message = a.where + " is cuBLASLt " + std::to_string(a.version) + "; flatmem was built with cuBLAS " +
                  std::to_string(CUBLAS_VER_MAJOR) + ".x headers and needs that major version";
  }
  return out;
}

}  // namespace

const Api &api() {
  static const Loaded loaded = load();
  if (loaded.status != FLATMEM_STATUS_SUCCESS) fail(loaded.status, loaded.message);
  return loaded.api;
}

void check(cublasStatus_t status, const char *what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    fail(FLATMEM_STATUS_INTERNAL, what, ": cuBLASLt ", api().GetStatusString(status), " (", int(status), ")");
}

}  // namespace flatmem::cuda::lt
