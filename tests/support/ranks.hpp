// Runs a scenario in `world` processes on this machine, as ranks of one
// communicator: fork()ed children (the parent never touches UCX), rank 0
// makes the unique id and hands it to the others through pipes. Each child
// returns a report ("" = passed) that the parent collects; a child that
// overruns `limit` is killed. Loopback only: the children get
// UCX_NET_DEVICES=lo and the given UCX_TLS.
#pragma once

#include <flatmem/flatmem.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace test {

struct RankOutcome {
  std::string report;      // what the scenario returned ("" = passed)
  int exit_code = -1;      // -1 if killed by a signal
  int signal = 0;          // the signal that ended it, or 0
  bool overran = false;    // killed by the harness after `limit`
  double seconds = 0.0;    // from start to exit
};

struct RankSetup {
  int rank = 0, world = 1;
  flatmem_comm_unique_id id{};
};

using Scenario = std::function<std::string(const RankSetup &)>;

// What rank 0 runs to make the id it hands to the others (default:
// flatmem_comm_unique_id_create("127.0.0.1:0")); "" or an error text.
using MakeId = std::function<std::string(flatmem_comm_unique_id *id)>;

// UCX_TLS for the children: "tcp,self" (default) or e.g. "tcp,self,posix".
std::vector<RankOutcome> run_ranks(int world, const Scenario &scenario,
                                   std::chrono::seconds limit = std::chrono::seconds(60),
                                   const std::string &ucx_tls = "tcp,self",
                                   const MakeId &make_id = nullptr);

// A TCP port on 127.0.0.1 that was free a moment ago.
int free_port();

// Creates the communicator of a RankSetup (options: timeout / connect timeout in ms, 0 = default).
flatmem_status create_comm(const RankSetup &setup, flatmem_comm_t **comm, long timeout_ms = 0,
                           long connect_timeout_ms = 0);

// "rank 1: <report>; rank 2: exit 3" for failed ranks, "" when all passed.
std::string failures(const std::vector<RankOutcome> &outcomes);

// For scenarios where rank `killed` SIGKILLs itself mid-run: "" when it did
// and every other rank passed, else what went wrong (as failures()).
std::string failures_besides_killed(const std::vector<RankOutcome> &outcomes, int killed);

// Sets the loopback UCX environment in this process (for single-process tests).
void use_loopback_ucx(const std::string &ucx_tls = "tcp,self");

}  // namespace test
