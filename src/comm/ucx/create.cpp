// flatmem_comm_unique_id_create, flatmem_comm_create and _from_env over UCX.
#include <cstdlib>
#include <functional>
#include <string>

#include "comm/create.hpp"
#include "comm/ucx/bootstrap.hpp"
#include "comm/ucx/tags.hpp"
#include "core/error.hpp"

namespace flatmem::comm {
namespace {

using namespace ucx;

// The environment's value of the first of `names` that is set, or "".
std::string first_set(std::initializer_list<const char *> names, const char **which) {
  for (const char *name : names) {
    const char *value = std::getenv(name);
    if (value != nullptr && *value != '\0') {
      *which = name;
      return value;
    }
  }
  return "";
}

int integer_variable(std::initializer_list<const char *> names, const char *meaning) {
  const char *which = nullptr;
  const std::string text = first_set(names, &which);
  if (text.empty()) {
    std::string list;
    for (const char *n : names) list += (list.empty() ? "" : ", ") + std::string(n);
    invalid("flatmem_comm_create_from_env: ", meaning, " not found in the environment (", list, ")");
  }
  char *end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (*end != '\0' || value < 0 || value >= max_ranks)
    invalid("flatmem_comm_create_from_env: ", which, "=\"", text, "\" is not a ", meaning);
  return int(value);
}

}  // namespace

flatmem_comm_unique_id make_unique_id(const char *address) {
  std::string text = address ? address : "";
  const char *env = std::getenv("FLATMEM_COMM_ADDRESS");
  const char *what = "address";
  if (text.empty() && env != nullptr && *env != '\0') {
    text = env;
    what = "FLATMEM_COMM_ADDRESS";
  }
  const HostPort where = parse_host_port(text, what);
  IdContents contents;
  contents.session = random_session();
  std::unique_ptr<Coordinator> coordinator;
  if (where.host.empty()) {
    coordinator = listen(any_address(where.port), what);
    contents.address = advertised_address(coordinator->bound.port());
  } else {
    coordinator = listen(resolve(where.host, where.port, what), what);
    contents.address = coordinator->bound;
  }
  register_coordinator(contents.session, std::move(coordinator));
  return encode_id(contents);
}

std::unique_ptr<Communicator> create_ucx(int rank, int world, const flatmem_comm_unique_id &id,
                                         const Config &config) {
  const IdContents contents = decode_id(id);
  if (rank != 0) return bootstrap_member(contents.address, rank, world, contents.session, config);
  auto coordinator = adopt_coordinator(contents.session);
  if (!coordinator)
    invalid("id: rank 0 must call flatmem_comm_create in the process that made the id, once "
            "(no listener of this id here; it may already have been used)");
  if (world == 1) coordinator->close_listener();
  return bootstrap_root(std::move(coordinator), world, contents.session, config);
}

std::unique_ptr<Communicator> create_ucx_from_env(const Config &config) {
  const char *which = nullptr;
  const std::string coordinator = first_set({"FLATMEM_COORDINATOR"}, &which);
  if (coordinator.empty())
    invalid("flatmem_comm_create_from_env: FLATMEM_COORDINATOR=host:port is not set");
  const HostPort where = parse_host_port(coordinator, "FLATMEM_COORDINATOR");
  if (where.host.empty() || where.port == 0)
    invalid("FLATMEM_COORDINATOR=\"", coordinator, "\": needs a host and a non-zero port");
  const int rank = integer_variable(
      {"FLATMEM_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "RANK"}, "rank");
  const int world = integer_variable({"FLATMEM_WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                                      "SLURM_NTASKS", "WORLD_SIZE"},
                                     "world size");
  if (world < 1 || rank >= world)
    invalid("flatmem_comm_create_from_env: rank ", rank, " and world size ", world,
            " from the environment; expected 0 <= rank < world size");
  std::uint64_t session = 0;
  if (const char *text = std::getenv("FLATMEM_SESSION"); text && *text)
    session = std::hash<std::string>{}(text) | 1;
  if (rank == 0) {
    auto listener = listen(any_address(where.port), "FLATMEM_COORDINATOR");
    if (world == 1) listener->close_listener();
    return bootstrap_root(std::move(listener), world, session, config);
  }
  return bootstrap_member(resolve(where.host, where.port, "FLATMEM_COORDINATOR"), rank, world,
                          session, config);
}

}  // namespace flatmem::comm
