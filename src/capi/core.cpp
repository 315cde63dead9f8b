// extern "C" entry points that belong to no handle: versions and statuses.
#include "core/cpu_engine.hpp"
#include "core/cpu_isa.hpp"
#include "core/options.hpp"
#include "core/error.hpp"

#define FLATMEM_STRINGIFY2(x) #x
#define FLATMEM_STRINGIFY(x) FLATMEM_STRINGIFY2(x)

extern "C" {

int flatmem_version(void) { return FLATMEM_VERSION; }

const char *flatmem_version_string(void) {
  return FLATMEM_STRINGIFY(FLATMEM_VERSION_MAJOR) "." FLATMEM_STRINGIFY(
      FLATMEM_VERSION_MINOR) "." FLATMEM_STRINGIFY(FLATMEM_VERSION_PATCH);
}

const char *flatmem_last_error(void) { return flatmem::last_error(); }

const char *flatmem_status_string(flatmem_status status) {
  switch (flatmem::enum_value(status)) {  // a C caller may pass any int
    case FLATMEM_STATUS_SUCCESS: return "FLATMEM_STATUS_SUCCESS";
    case FLATMEM_STATUS_INVALID_ARGUMENT: return "FLATMEM_STATUS_INVALID_ARGUMENT";
    case FLATMEM_STATUS_UNSUPPORTED: return "FLATMEM_STATUS_UNSUPPORTED";
    case FLATMEM_STATUS_OUT_OF_MEMORY: return "FLATMEM_STATUS_OUT_OF_MEMORY";
    case FLATMEM_STATUS_WORKSPACE_TOO_SMALL: return "FLATMEM_STATUS_WORKSPACE_TOO_SMALL";
    case FLATMEM_STATUS_NON_FINITE: return "FLATMEM_STATUS_NON_FINITE";
    case FLATMEM_STATUS_INTERNAL: return "FLATMEM_STATUS_INTERNAL";
    case FLATMEM_STATUS_TIMEOUT: return "FLATMEM_STATUS_TIMEOUT";
    case FLATMEM_STATUS_PEER_FAILURE: return "FLATMEM_STATUS_PEER_FAILURE";
    case FLATMEM_STATUS_COMM_POISONED: return "FLATMEM_STATUS_COMM_POISONED";
    default: return "FLATMEM_STATUS_UNKNOWN";
  }
}

}  // extern "C"

// ---- CPU instruction set of the element-wise kernels --------------------------

namespace {

flatmem_cpu_isa to_c(flatmem::cpu_isa::Isa isa) { return flatmem_cpu_isa(int(isa)); }

}  // namespace

extern "C" {

flatmem_status flatmem_cpu_isa_get(flatmem_cpu_isa *in_use, flatmem_cpu_isa *best) {
  return flatmem::guarded([&] {
    if (in_use == nullptr && best == nullptr) flatmem::invalid("in_use, best: both NULL, at least one is needed");
    const auto active = flatmem::cpu_isa::active();  // throws for a bad FLATMEM_CPU_ISA
    if (in_use) *in_use = to_c(active);
    if (best) *best = to_c(flatmem::cpu_isa::detected());
  });
}

flatmem_status flatmem_cpu_isa_set(flatmem_cpu_isa isa) {
  return flatmem::guarded([&] {
    const std::int32_t value = flatmem::enum_value(isa);  // a C caller may pass any int
    if (value == FLATMEM_CPU_ISA_DEFAULT) return flatmem::cpu_isa::reset();
    if (value < FLATMEM_CPU_ISA_BASELINE || value > FLATMEM_CPU_ISA_AMX)
      flatmem::invalid("isa: ", value, " is not a flatmem_cpu_isa value (0 .. 5)");
    flatmem::cpu_isa::select(flatmem::cpu_isa::Isa(value));
  });
}

const char *flatmem_cpu_isa_name(flatmem_cpu_isa isa) {
  switch (flatmem::enum_value(isa)) {
    case FLATMEM_CPU_ISA_DEFAULT: return "default";
    case FLATMEM_CPU_ISA_BASELINE: return "baseline";
    case FLATMEM_CPU_ISA_AVX2: return "avx2";
    case FLATMEM_CPU_ISA_AVX512: return "avx512";
    case FLATMEM_CPU_ISA_AVX512BF16: return "avx512bf16";
    case FLATMEM_CPU_ISA_AMX: return "amx";
    default: return "unknown";
  }
}

const char *flatmem_cpu_isa_engine(flatmem_cpu_isa isa) {
  const std::int32_t value = flatmem::enum_value(isa);
  if (value == FLATMEM_CPU_ISA_DEFAULT) return flatmem::cpu_isa::engine(flatmem::cpu_isa::for_kernels());
  if (value < FLATMEM_CPU_ISA_BASELINE || value > FLATMEM_CPU_ISA_AMX) return "unknown";
  return flatmem::cpu_isa::engine(flatmem::cpu_isa::Isa(value));
}

}  // extern "C"
