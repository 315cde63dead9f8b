// libFuzzer target: flatmem_comm_create_from_env with fuzzed launcher variables --
// FLATMEM_COORDINATOR, FLATMEM_RANK / _WORLD_SIZE, the launchers' OMPI_COMM_WORLD_*,
// PMI_*, SLURM_*, RANK / WORLD_SIZE, FLATMEM_SESSION, FLATMEM_COMM_TIMEOUT_MS -- each
// unset, set to a working value, or set to fuzzed text. Connect timeouts are tiny; runs
// only in a loopback-only network namespace (support/comm_sandbox.hpp).
//
// Checks: every failure has a message and leaves *out unset; a created communicator
// reports the rank and world size the variables name.
//
// Input layout: Plan (one byte per variable), then the fuzzed texts in variable order.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <flatmem/flatmem.h>

#include "support/comm_sandbox.hpp"
#include "support/fuzz_input.hpp"

using namespace flatmem_fuzz;

namespace {

struct Variable {
  const char *name;
  const char *working;  // a value that works in a world of 1 (nullptr: leave unset)
};

constexpr Variable variables[] = {
    {"FLATMEM_COORDINATOR", "127.0.0.1:29517"},
    {"FLATMEM_RANK", "0"},
    {"FLATMEM_WORLD_SIZE", "1"},
    {"OMPI_COMM_WORLD_RANK", "0"},
    {"OMPI_COMM_WORLD_SIZE", "1"},
    {"PMI_RANK", "0"},
    {"PMI_SIZE", "1"},
    {"SLURM_PROCID", "0"},
    {"SLURM_NTASKS", "1"},
    {"RANK", "0"},
    {"WORLD_SIZE", "1"},
    {"FLATMEM_SESSION", "fuzz"},
    {"FLATMEM_COMM_TIMEOUT_MS", "1000"},
};
constexpr std::size_t kVariables = sizeof variables / sizeof variables[0];

struct Plan {
  std::uint8_t choice[kVariables];  // 0: working value for FLATMEM_*, unset for the others
  std::uint8_t connect_timeout;
};

std::string fuzzed_text(Reader &in) {
  static const char *table[] = {"", "0", "1", "2", "-1", "4096", "4097", "1e3", " 1", "1 ", "0x1",
                                "99999999999999999999", "127.0.0.1", ":29517", "[::1]:29517",
                                "127.0.0.1:0", "127.0.0.1:65536", "[::1", "a:b:c"};
  constexpr std::size_t n = sizeof table / sizeof table[0];
  const std::uint8_t selector = in.byte();
  if (selector < 2 * n) return table[selector % n];
  std::string text;
  const std::size_t length = in.byte() % 40;
  for (std::size_t i = 0; i < length; ++i) {
    const char c = char(in.byte());
    text += c == '\0' ? '0' : c;
  }
  return text;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
  enter_comm_sandbox();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t *data, std::size_t size) {
  Reader in(data, size);
  const Plan p = read_plan<Plan>(in);
  for (std::size_t i = 0; i < kVariables; ++i) {
    const Variable &v = variables[i];
    const bool flatmem_own = std::string(v.name).rfind("FLATMEM_", 0) == 0;
    switch (p.choice[i] % 4) {
      case 0: if (flatmem_own) setenv(v.name, v.working, 1); else unsetenv(v.name); break;
      case 1: unsetenv(v.name); break;
      case 2: setenv(v.name, v.working, 1); break;
      default: setenv(v.name, fuzzed_text(in).c_str(), 1); break;
    }
  }
  flatmem_comm_options o = FLATMEM_COMM_OPTIONS_INIT;
  o.connect_timeout_ms = kConnectTimeoutsMs[p.connect_timeout % 3];
  flatmem_comm_t *comm = nullptr;
  const bool created = check_status(flatmem_comm_create_from_env(&comm, &o), "flatmem_comm_create_from_env");
  if (!created && comm != nullptr) violation("flatmem_comm_create_from_env", "failed but set *out");
  if (created) {
    std::int32_t rank = -1, world = -1;
    check_status(flatmem_comm_rank(comm, &rank), "flatmem_comm_rank");
    check_status(flatmem_comm_world_size(comm, &world), "flatmem_comm_world_size");
    if (rank < 0 || rank >= world) violation("flatmem_comm_create_from_env", "rank outside the world");
    check_status(flatmem_comm_destroy(comm), "flatmem_comm_destroy");
  }
  return 0;
}
