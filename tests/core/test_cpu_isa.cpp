// The CPU instruction-set choice of the element-wise kernels: the query, the
// selection from code, and FLATMEM_CPU_ISA read by a fresh process
// (cpu_isa_probe, one process per setting since the variable is read once).
// The numeric suites themselves run once per ISA under isa_run (label isa).
#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "support/contrastive_bitwise.hpp"

using namespace flatmem_test;

namespace {

// Least capable first; the last is the highest level there is.
const std::array<flatmem_cpu_isa, 5> kIsas = {FLATMEM_CPU_ISA_BASELINE, FLATMEM_CPU_ISA_AVX2, FLATMEM_CPU_ISA_AVX512,
                                              FLATMEM_CPU_ISA_AVX512BF16, FLATMEM_CPU_ISA_AMX};
constexpr flatmem_cpu_isa kHighest = FLATMEM_CPU_ISA_AMX;

flatmem_cpu_isa best_isa() {
  flatmem_cpu_isa best = FLATMEM_CPU_ISA_DEFAULT;
  REQUIRE(flatmem_cpu_isa_get(nullptr, &best) == FLATMEM_STATUS_SUCCESS);
  return best;
}

flatmem_cpu_isa isa_in_use() {
  flatmem_cpu_isa in_use = FLATMEM_CPU_ISA_DEFAULT;
  REQUIRE(flatmem_cpu_isa_get(&in_use, nullptr) == FLATMEM_STATUS_SUCCESS);
  return in_use;
}

// Selects an ISA for the scope, then back to the default.
struct SelectedIsa {
  explicit SelectedIsa(flatmem_cpu_isa isa) { REQUIRE(flatmem_cpu_isa_set(isa) == FLATMEM_STATUS_SUCCESS); }
  ~SelectedIsa() { flatmem_cpu_isa_set(FLATMEM_CPU_ISA_DEFAULT); }
};

struct Probe {
  std::string line, error;
};

// cpu_isa_probe's two lines with FLATMEM_CPU_ISA set to `value` (nullptr:
// unset).
Probe probe(const char *value) {
  std::string command = value == nullptr ? "env -u FLATMEM_CPU_ISA " : "env FLATMEM_CPU_ISA='" + std::string(value) + "' ";
  command += FLATMEM_TEST_CPU_ISA_PROBE;
  FILE *pipe = popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string text;
  char buffer[512];
  while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) text += buffer;
  REQUIRE(pclose(pipe) == 0);
  const auto newline = text.find('\n');
  REQUIRE(newline != std::string::npos);
  Probe p{text.substr(0, newline), text.substr(newline + 1)};
  if (!p.error.empty() && p.error.back() == '\n') p.error.pop_back();
  return p;
}

std::string expected_success(flatmem_cpu_isa in_use, flatmem_cpu_isa best) {
  return std::string("get=FLATMEM_STATUS_SUCCESS in_use=") + flatmem_cpu_isa_name(in_use) +
         " best=" + flatmem_cpu_isa_name(best) +
         " contrastive_create=FLATMEM_STATUS_SUCCESS block_create=FLATMEM_STATUS_SUCCESS";
}

}  // namespace

TEST_CASE("core/cpu-isa/names") {
  CHECK(std::string(flatmem_cpu_isa_name(FLATMEM_CPU_ISA_DEFAULT)) == "default");
  CHECK(std::string(flatmem_cpu_isa_name(FLATMEM_CPU_ISA_BASELINE)) == "baseline");
  CHECK(std::string(flatmem_cpu_isa_name(FLATMEM_CPU_ISA_AVX2)) == "avx2");
  CHECK(std::string(flatmem_cpu_isa_name(FLATMEM_CPU_ISA_AVX512)) == "avx512");
  CHECK(std::string(flatmem_cpu_isa_name(FLATMEM_CPU_ISA_AVX512BF16)) == "avx512bf16");
  // the levels are ordered: each one runs everything the one below it does
  CHECK(int(FLATMEM_CPU_ISA_BASELINE) == 1);
  CHECK(int(FLATMEM_CPU_ISA_AVX2) == 2);
  CHECK(int(FLATMEM_CPU_ISA_AVX512) == 3);
  CHECK(int(FLATMEM_CPU_ISA_AVX512BF16) == 4);
  CHECK(std::string(flatmem_cpu_isa_name(FLATMEM_CPU_ISA_AMX)) == "amx");
  CHECK(int(FLATMEM_CPU_ISA_AMX) == 5);
}

TEST_CASE("core/cpu-isa/get-reports-the-isa-in-use-within-the-best") {
  flatmem_cpu_isa in_use = FLATMEM_CPU_ISA_DEFAULT, best = FLATMEM_CPU_ISA_DEFAULT;
  REQUIRE(flatmem_cpu_isa_get(&in_use, &best) == FLATMEM_STATUS_SUCCESS);
  CHECK(int(best) >= int(FLATMEM_CPU_ISA_BASELINE));
  CHECK(int(best) <= int(kHighest));
  CHECK(int(in_use) >= int(FLATMEM_CPU_ISA_BASELINE));
  CHECK(int(in_use) <= int(best));
  CHECK(flatmem_cpu_isa_get(nullptr, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(std::string(flatmem_last_error()).find("in_use") != std::string::npos);
}

TEST_CASE("core/cpu-isa/set-selects-every-isa-up-to-the-best") {
  const flatmem_cpu_isa best = best_isa();
  for (flatmem_cpu_isa isa : kIsas) {
    if (int(isa) > int(best)) continue;
    CAPTURE(flatmem_cpu_isa_name(isa));
    SelectedIsa selected(isa);
    CHECK(isa_in_use() == isa);
    // bitwise reproducible within one ISA, whatever the thread count
    const BitwiseProblem p({FLATMEM_CONTRASTIVE_SYMMETRIC, Dtype::f32, 37, 37, 29});  // partial vectors
    check_identical(p.run(2), p.run(1), true);
  }
  // DEFAULT: back to what the environment gives a fresh process
  REQUIRE(flatmem_cpu_isa_set(FLATMEM_CPU_ISA_DEFAULT) == FLATMEM_STATUS_SUCCESS);
  const std::string in_use = std::string("in_use=") + flatmem_cpu_isa_name(isa_in_use()) + " ";
  CHECK(probe(std::getenv("FLATMEM_CPU_ISA")).line.find(in_use) != std::string::npos);
}

TEST_CASE("core/cpu-isa/set-above-the-best-is-unsupported-and-changes-nothing") {
  const flatmem_cpu_isa best = best_isa();
  if (best == kHighest) {
    MESSAGE("this processor has AMX, the highest ISA: nothing above it to refuse here "
            "(AVX2-only, AVX-512 and AVX512_BF16-without-AMX machines run this case)");
    return;
  }
  const flatmem_cpu_isa before = isa_in_use();
  for (flatmem_cpu_isa above : kIsas) {
    if (int(above) <= int(best)) continue;
    CAPTURE(flatmem_cpu_isa_name(above));
    CHECK(flatmem_cpu_isa_set(above) == FLATMEM_STATUS_UNSUPPORTED);
    const std::string message = flatmem_last_error();
    CHECK(message.find(flatmem_cpu_isa_name(above)) != std::string::npos);
    CHECK(message.find(flatmem_cpu_isa_name(best)) != std::string::npos);
    CHECK(isa_in_use() == before);
  }
}

// The bf16 levels every machine answers differently: selected (and their bf16
// tile products reproducible whatever the thread count) where the processor
// has them, refused naming the level and the best one where it does not.
void check_selectable_exactly_where_present(flatmem_cpu_isa level) {
  const flatmem_cpu_isa best = best_isa();
  const flatmem_cpu_isa before = isa_in_use();
  if (int(best) >= int(level)) {
    SelectedIsa selected(level);
    CHECK(isa_in_use() == level);
    const BitwiseProblem p({FLATMEM_CONTRASTIVE_SYMMETRIC, Dtype::bf16, 37, 37, 29});
    check_identical(p.run(2), p.run(1), true);
  } else {
    CHECK(flatmem_cpu_isa_set(level) == FLATMEM_STATUS_UNSUPPORTED);
    const std::string message = flatmem_last_error();
    CHECK(message.find(flatmem_cpu_isa_name(level)) != std::string::npos);
    CHECK(message.find(flatmem_cpu_isa_name(best)) != std::string::npos);
  }
  CHECK(isa_in_use() == before);
}

TEST_CASE("core/cpu-isa/avx512bf16-is-selectable-exactly-where-the-processor-has-it") {
  // AVX2-only and AVX-512-without-BF16 processors refuse it; AVX512_BF16 and AMX ones run it
  // (the vdpbf16ps tile products).
  check_selectable_exactly_where_present(FLATMEM_CPU_ISA_AVX512BF16);
}

TEST_CASE("core/cpu-isa/amx-is-selectable-exactly-where-the-processor-has-it") {
  // Only AMX processors (with the kernel's permission for tile state) run it: the bf16 tile
  // products on AMX tiles.
  check_selectable_exactly_where_present(FLATMEM_CPU_ISA_AMX);
}

TEST_CASE("core/cpu-isa/set-and-name-take-any-int-a-c-caller-passes") {
  // A C caller may pass any int where the enum is expected; called through
  // int-typed pointers (the same calling convention) so that no out-of-range
  // enum value exists on this side.
  const auto set = reinterpret_cast<flatmem_status (*)(std::int32_t)>(&flatmem_cpu_isa_set);
  const auto name = reinterpret_cast<const char *(*)(std::int32_t)>(&flatmem_cpu_isa_name);
  const flatmem_cpu_isa before = isa_in_use();
  for (std::int32_t value : {-1, FLATMEM_CPU_ISA_AMX + 1, 0x7fffffff, -0x7fffffff - 1}) {
    CAPTURE(value);
    CHECK(set(value) == FLATMEM_STATUS_INVALID_ARGUMENT);
    CHECK(std::string(flatmem_last_error()).find("isa: " + std::to_string(value)) != std::string::npos);
    CHECK(std::string(name(value)) == "unknown");
  }
  CHECK(isa_in_use() == before);
}

TEST_CASE("core/cpu-isa/environment-caps-a-fresh-process") {
  const flatmem_cpu_isa best = best_isa();
  CHECK(probe(nullptr).line == expected_success(best, best));
  CHECK(probe("").line == expected_success(best, best));
  CHECK(probe("auto").line == expected_success(best, best));
  for (flatmem_cpu_isa isa : kIsas) {
    if (int(isa) > int(best)) continue;
    CAPTURE(flatmem_cpu_isa_name(isa));
    CHECK(probe(flatmem_cpu_isa_name(isa)).line == expected_success(isa, best));
  }
  // names are case-insensitive
  CHECK(probe("BASELINE").line == expected_success(FLATMEM_CPU_ISA_BASELINE, best));
  CHECK(probe("Auto").line == expected_success(best, best));
  for (const auto &[level, word] : {std::pair{FLATMEM_CPU_ISA_AVX512BF16, "AVX512BF16"},
                                     std::pair{FLATMEM_CPU_ISA_AVX512BF16, "Avx512Bf16"},
                                     std::pair{FLATMEM_CPU_ISA_AVX512BF16, "avx512BF16"},
                                     std::pair{FLATMEM_CPU_ISA_AMX, "AMX"}, std::pair{FLATMEM_CPU_ISA_AMX, "Amx"}}) {
    CAPTURE(word);
    const Probe p = probe(word);
    if (int(best) >= int(level)) {
      CHECK(p.line == expected_success(level, best));
    } else {  // a known word this processor cannot run: unsupported, not invalid
      CHECK(p.line.find("get=FLATMEM_STATUS_UNSUPPORTED") != std::string::npos);
      CHECK(p.error.find(flatmem_cpu_isa_name(level)) != std::string::npos);
    }
  }
}

TEST_CASE("core/cpu-isa/environment-with-an-unknown-word-fails-every-entry-point") {
  for (const char *value : {"avx1024", "sse2", "avx-512", " avx2", "avx512bf", "avx512_bf16", "avx512-bf16",
                            "avx512bf16 ", "bf16"}) {
    CAPTURE(value);
    const Probe p = probe(value);
    CHECK(p.line.find("get=FLATMEM_STATUS_INVALID_ARGUMENT") != std::string::npos);
    CHECK(p.line.find("contrastive_create=FLATMEM_STATUS_INVALID_ARGUMENT") != std::string::npos);
    CHECK(p.line.find("block_create=FLATMEM_STATUS_INVALID_ARGUMENT") != std::string::npos);
    CHECK(p.error.find("FLATMEM_CPU_ISA") != std::string::npos);
    CHECK(p.error.find(value) != std::string::npos);
    CHECK(p.error.find("avx512bf16") != std::string::npos);  // the words it takes
  }
}

TEST_CASE("core/cpu-isa/environment-above-the-best-fails-every-entry-point") {
  const flatmem_cpu_isa best = best_isa();
  if (best == kHighest) {
    MESSAGE("this processor has AMX: nothing above it to ask for "
            "(AVX2-only, AVX-512 and AVX512_BF16-without-AMX machines run this case)");
    return;
  }
  for (flatmem_cpu_isa isa : kIsas) {
    if (int(isa) <= int(best)) continue;
    const char *above = flatmem_cpu_isa_name(isa);
    CAPTURE(above);
    const Probe p = probe(above);
    CHECK(p.line.find("get=FLATMEM_STATUS_UNSUPPORTED") != std::string::npos);
    CHECK(p.line.find("contrastive_create=FLATMEM_STATUS_UNSUPPORTED") != std::string::npos);
    CHECK(p.line.find("block_create=FLATMEM_STATUS_UNSUPPORTED") != std::string::npos);
    CHECK(p.error.find("FLATMEM_CPU_ISA") != std::string::npos);
    CHECK(p.error.find(above) != std::string::npos);
    CHECK(p.error.find(flatmem_cpu_isa_name(best)) != std::string::npos);
  }
}
