#include "core/cpu_isa.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <strings.h>
#include <string>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "core/error.hpp"
#include "core/isa_variants.hpp"

namespace flatmem::cpu_isa {
namespace {

#if defined(__x86_64__) && defined(__GNUC__)
// Linux's arch_prctl codes (asm/prctl.h) and the XSAVE feature number of AMX
// tile data (XFEATURE_XTILEDATA), spelled out: older kernel headers lack them.
constexpr long kArchGetXcompPerm = 0x1022, kArchReqXcompPerm = 0x1023;
constexpr unsigned kXfeatureTileData = 18;

bool amx_detect() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;  // OSXSAVE
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool tile = d & (1u << 24), bf16 = d & (1u << 22);
  if (!tile || !bf16) return false;
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & (3u << 17)) != (3u << 17)) return false;  // XTILECFG and XTILEDATA enabled by the OS
  // Permission for the process (Linux 5.16+); an older kernel answers EINVAL,
  // and then tiles are not for us.
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureTileData) != 0) return false;
  unsigned long permitted = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &permitted) != 0) return false;
  return permitted & (1ul << kXfeatureTileData);
}
#else
bool amx_detect() { return false; }
#endif

Isa detect() {
#if FLATMEM_ISA_VARIANTS
  __builtin_cpu_init();
  // GCC's checks include the OS's XSAVE support of the wider registers.
  if (__builtin_cpu_supports("x86-64-v4")) {
    if (!__builtin_cpu_supports("avx512bf16")) return Isa::avx512;
    return amx_usable() ? Isa::amx : Isa::avx512bf16;
  }
  if (__builtin_cpu_supports("x86-64-v3")) return Isa::avx2;
#endif
  return Isa::baseline;
}

// The environment's choice, or the error it makes (read once per process).
struct EnvironmentChoice {
  Isa isa = Isa::baseline;
  flatmem_status status = FLATMEM_STATUS_SUCCESS;
  std::string message;
};

EnvironmentChoice from_environment() {
  EnvironmentChoice c;
  const Isa best = detected();
  c.isa = best;
  const char *value = std::getenv("FLATMEM_CPU_ISA");
  // Case-insensitive, as users write ISA names both ways (AVX2, avx2).
  if (value == nullptr || value[0] == '\0' || strcasecmp(value, "auto") == 0) return c;
  Isa wanted;
  if (strcasecmp(value, "amx") == 0) wanted = Isa::amx;
  else if (strcasecmp(value, "avx512bf16") == 0) wanted = Isa::avx512bf16;
  else if (strcasecmp(value, "avx512") == 0) wanted = Isa::avx512;
  else if (strcasecmp(value, "avx2") == 0) wanted = Isa::avx2;
  else if (strcasecmp(value, "baseline") == 0) wanted = Isa::baseline;
  else {
    c.status = FLATMEM_STATUS_INVALID_ARGUMENT;
    c.message = std::string("environment variable FLATMEM_CPU_ISA='") + value +
                "': expected avx512bf16, avx512, avx2, baseline or auto";
    return c;
  }
  if (int(wanted) > int(best)) {
    c.status = FLATMEM_STATUS_UNSUPPORTED;
    c.message = std::string("environment variable FLATMEM_CPU_ISA=") + value + " asks for " +
                name(wanted) + " but this processor (or this build) runs at most " + name(best);
    return c;
  }
  c.isa = wanted;
  return c;
}

const EnvironmentChoice &environment() {
  static const EnvironmentChoice choice = from_environment();
  return choice;
}

// 0: follow the environment; otherwise an Isa selected by select().
std::atomic<int> selected{0};

}  // namespace

bool amx_usable() {
  static const bool usable = amx_detect();
  return usable;
}

Isa detected() {
  static const Isa best = detect();
  return best;
}

Isa active() {
  const int s = selected.load(std::memory_order_relaxed);
  if (s != 0) return Isa(s);
  const EnvironmentChoice &env = environment();
  if (env.status != FLATMEM_STATUS_SUCCESS) fail(env.status, env.message);
  return env.isa;
}

Isa for_kernels() noexcept {
  const int s = selected.load(std::memory_order_relaxed);
  if (s != 0) return Isa(s);
  const EnvironmentChoice &env = environment();
  return env.status == FLATMEM_STATUS_SUCCESS ? env.isa : Isa::baseline;
}

void select(Isa isa) {
  if (int(isa) > int(detected()))
    fail(FLATMEM_STATUS_UNSUPPORTED, "isa: ", name(isa), " asked for, but this processor (or this build) runs at most ",
         name(detected()));
  selected.store(int(isa), std::memory_order_relaxed);
}

void reset() { selected.store(0, std::memory_order_relaxed); }

const char *name(Isa isa) {
  switch (isa) {
    case Isa::amx: return "amx";
    case Isa::avx512bf16: return "avx512bf16";
    case Isa::avx512: return "avx512";
    case Isa::avx2: return "avx2";
    case Isa::baseline: return "baseline";
  }
  return "unknown";
}

}  // namespace flatmem::cpu_isa
