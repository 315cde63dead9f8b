#include "core/cpu_engine.hpp"

#include <string>

#include <flatmem/flatmem.h>

#include "contrastive/cpu/amx_gemm.hpp"
#include "core/gemm/sgemm.hpp"


namespace flatmem::cpu_isa {
namespace {

#define FLATMEM_STRINGIZE_(x) #x
#define FLATMEM_STRINGIZE(x) FLATMEM_STRINGIZE_(x)
constexpr const char *kVersion = FLATMEM_STRINGIZE(FLATMEM_VERSION_MAJOR) "." FLATMEM_STRINGIZE(
    FLATMEM_VERSION_MINOR) "." FLATMEM_STRINGIZE(FLATMEM_VERSION_PATCH);

// The bf16 tile products' engine at `isa` (contrastive/cpu/tile_gemm.cpp decides the same way).
std::string bf16_engine(Isa isa) {
  if (isa == Isa::amx) return contrastive::cpu::amx::kKernelName;
  if (isa >= Isa::avx512bf16) return "vdpbf16ps 6x64 (bf16 products, fp32 sums)";
  return "widened to fp32";
}

std::string describe(Isa isa) {
  return std::string("flatmem ") + kVersion + " own kernels at " + name(isa) + ": fp32 " +
         gemm::sgemm_kernel(isa) + "; bf16 " + bf16_engine(isa) + "; fp16 widened to fp32";
}

}  // namespace

const char *engine(Isa isa) {
  static const std::string text[] = {describe(Isa::baseline), describe(Isa::avx2), describe(Isa::avx512),
                                     describe(Isa::avx512bf16), describe(Isa::amx)};
  return text[int(isa) - int(Isa::baseline)].c_str();
}

}  // namespace flatmem::cpu_isa
