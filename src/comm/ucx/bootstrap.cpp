#include "comm/ucx/bootstrap.hpp"

#include <algorithm>
#include <thread>

#include "comm/ucx/messages.hpp"
#include "comm/ucx/tags.hpp"
#include "core/error.hpp"

namespace flatmem::comm::ucx {
namespace {

constexpr std::size_t hello_capacity = 64 * 1024;
constexpr std::size_t reject_capacity = 8 * 1024;
constexpr auto retry_pause = std::chrono::milliseconds(100);

std::uint64_t boot_tag(int source, Boot type) { return make_tag(Kind::bootstrap, source, std::uint64_t(type)); }

std::string list_ranks(const std::vector<int> &ranks) {
  std::string text;
  for (int r : ranks) text += (text.empty() ? "" : ", ") + std::to_string(r);
  return text;
}

// The mesh: endpoints to every rank from the roster, then a "ready" to and
// from every other rank within the deadline.
struct Mesh {
  std::vector<ucp_ep_h> endpoints;
  std::vector<std::unique_ptr<EndpointInfo>> infos;
};

Mesh connect_mesh(Engine &engine, int rank, const std::vector<std::vector<char>> &roster,
                  Clock::time_point deadline, const std::string &where) {
  const int world = int(roster.size());
  Mesh mesh;
  for (int peer = 0; peer < world; ++peer) {
    mesh.infos.push_back(std::make_unique<EndpointInfo>());
    mesh.infos.back()->peer = peer;
    mesh.endpoints.push_back(engine.connect_to_address(roster[std::size_t(peer)], mesh.infos.back().get()));
  }
  const char token = 1;
  std::vector<char> received(static_cast<std::size_t>(world));
  std::vector<UcxTransferPtr> transfers(static_cast<std::size_t>(world)), sends;
  for (int peer = 0; peer < world; ++peer) {
    if (peer == rank) continue;
    transfers[std::size_t(peer)] = engine.post_recv(peer, &received[std::size_t(peer)], 1, boot_tag(peer, Boot::ready));
    sends.push_back(engine.post_send(mesh.endpoints[std::size_t(peer)], peer, &token, 1, boot_tag(rank, Boot::ready)));
  }
  const auto all_done = [&] {
    for (const auto &t : transfers)
      if (t && !engine.finished(*t)) return false;
    return std::all_of(sends.begin(), sends.end(), [&](const UcxTransferPtr &t) { return engine.finished(*t); });
  };
  const bool done = engine.progress_until(all_done, deadline);
  std::vector<int> silent, failed;
  for (int peer = 0; peer < world; ++peer) {
    if (peer == rank) continue;
    const auto &t = transfers[std::size_t(peer)];
    if (!engine.finished(*t)) silent.push_back(peer);
    else if (t->status != UCS_OK || mesh.infos[std::size_t(peer)]->failure != UCS_OK) failed.push_back(peer);
  }
  if (!failed.empty())
    fail(FLATMEM_STATUS_PEER_FAILURE, "flatmem_comm_create (rank ", rank, "): connecting to rank(s) ",
         list_ranks(failed), " failed (", where, ")");
  if (!done || !silent.empty())
    fail(FLATMEM_STATUS_TIMEOUT, "flatmem_comm_create (rank ", rank, "): rank(s) ", list_ranks(silent),
         " did not answer on the direct connections before the deadline (", where, ")");
  return mesh;
}

// Sends `bytes` to the worker at `address` on a temporary endpoint (best effort, bounded).
void send_once(Engine &engine, const std::vector<char> &address, int peer, std::uint64_t tag,
               const std::vector<char> &bytes) {
  EndpointInfo info;
  info.peer = -1;
  ucp_ep_h ep = nullptr;
  try {
    ep = engine.connect_to_address(address, &info);
  } catch (const Error &) {
    return;
  }
  auto t = engine.post_send(ep, peer, bytes.data(), bytes.size(), tag);
  engine.progress_until([&] { return engine.finished(*t) || info.failure != UCS_OK; },
                        Clock::now() + std::chrono::milliseconds(500));
  engine.close_now(ep);
  engine.progress_until([&] { return engine.finished(*t); }, Clock::now() + std::chrono::milliseconds(200));
}

std::unique_ptr<UcxCommunicator> finish(std::unique_ptr<Engine> engine, int rank, int world, Mesh mesh,
                                        std::vector<ucp_ep_h> boot_eps,
                                        std::vector<std::unique_ptr<EndpointInfo>> boot_infos,
                                        const Config &config) {
  engine->start(rank, std::move(mesh.endpoints), std::move(mesh.infos), std::move(boot_eps),
                std::move(boot_infos));
  return std::make_unique<UcxCommunicator>(rank, world, config, std::move(engine));
}

}  // namespace

std::unique_ptr<UcxCommunicator> bootstrap_root(std::unique_ptr<Coordinator> coordinator, int world,
                                                std::uint64_t session, const Config &config) {
  Engine &engine = *coordinator->engine;
  const std::string where = "coordinator " + coordinator->bound.text();
  const auto deadline = Clock::now() + config.connect_timeout;
  std::vector<std::vector<char>> roster(static_cast<std::size_t>(world));
  roster[0] = engine.worker_address();
  std::vector<ucp_ep_h> boot_eps;
  std::vector<std::unique_ptr<EndpointInfo>> boot_infos;
  std::vector<char> buffer(hello_capacity);
  int joined = 1;

  const auto reject_all = [&](const std::string &reason, flatmem_status status) {
    const auto bytes = encode(Reject{status, reason});
    for (int r = 1; r < world; ++r)
      if (!roster[std::size_t(r)].empty()) send_once(engine, roster[std::size_t(r)], r, boot_tag(0, Boot::reject), bytes);
  };

  while (joined < world) {
    auto hello = engine.post_recv(-1, buffer.data(), buffer.size(), boot_tag(0, Boot::hello), any_source);
    const bool arrived = engine.progress_until(
        [&] {
          for (ucp_conn_request_h request : coordinator->take_requests()) {
            boot_infos.push_back(std::make_unique<EndpointInfo>());
            boot_eps.push_back(engine.accept(request, boot_infos.back().get()));
          }
          return engine.finished(*hello);
        },
        deadline);
    if (!arrived) {
      std::vector<int> missing;
      for (int r = 1; r < world; ++r)
        if (roster[std::size_t(r)].empty()) missing.push_back(r);
      const std::string reason = "rank(s) " + list_ranks(missing) + " of " + std::to_string(world) +
                                 " did not arrive within " + std::to_string(config.connect_timeout.count()) +
                                 " ms (" + where + ")";
      reject_all("rank 0 gave up: " + reason, FLATMEM_STATUS_TIMEOUT);
      // The receive still points at `buffer`: poison-free engine, so cancel by destroying it.
      fail(FLATMEM_STATUS_TIMEOUT, "flatmem_comm_create (rank 0): ", reason);
    }
    Hello h;
    if (hello->status != UCS_OK || !decode(buffer, hello->received, &h)) continue;  // not ours
    const std::string who = "rank " + std::to_string(h.rank);
    if (session != 0 && h.session != 0 && h.session != session) {
      send_once(engine, h.address, h.rank, boot_tag(0, Boot::reject),
                encode(Reject{FLATMEM_STATUS_INVALID_ARGUMENT,
                              "the coordinator at " + coordinator->bound.text() +
                                  " belongs to another session: this rank's id is stale or from another job"}));
      continue;
    }
    std::string problem;
    if (h.world != world)
      problem = who + " was created with world_size " + std::to_string(h.world) + ", rank 0 with " +
                std::to_string(world);
    else if (h.rank < 1 || h.rank >= world)
      problem = "a rank joined with rank " + std::to_string(h.rank) + ", outside 1 .. " + std::to_string(world - 1);
    else if (!roster[std::size_t(h.rank)].empty() && roster[std::size_t(h.rank)] != h.address)
      problem = "two processes joined as " + who;
    if (!problem.empty()) {
      const auto bytes = encode(Reject{FLATMEM_STATUS_INVALID_ARGUMENT, problem});
      if (h.rank >= 0 && h.rank < world && roster[std::size_t(h.rank)].empty()) roster[std::size_t(h.rank)] = h.address;
      send_once(engine, h.address, h.rank, boot_tag(0, Boot::reject), bytes);
      reject_all(problem, FLATMEM_STATUS_INVALID_ARGUMENT);
      invalid("flatmem_comm_create (rank 0): ", problem);
    }
    if (roster[std::size_t(h.rank)].empty()) ++joined;
    roster[std::size_t(h.rank)] = h.address;
  }
  coordinator->close_listener();

  // The roster goes out on the mesh endpoints, which the ready exchange then checks.
  const auto roster_bytes = encode(roster);
  std::vector<std::unique_ptr<EndpointInfo>> infos;
  std::vector<ucp_ep_h> eps;
  std::vector<UcxTransferPtr> sends;
  for (int r = 1; r < world; ++r) {
    infos.push_back(std::make_unique<EndpointInfo>());
    infos.back()->peer = -1;
    eps.push_back(engine.connect_to_address(roster[std::size_t(r)], infos.back().get()));
    sends.push_back(engine.post_send(eps.back(), r, roster_bytes.data(), roster_bytes.size(), boot_tag(0, Boot::roster)));
  }
  engine.progress_until([&] { return std::all_of(sends.begin(), sends.end(), [&](auto &t) { return engine.finished(*t); }); },
                        deadline);
  for (std::size_t i = 0; i < sends.size(); ++i)
    if (!engine.finished(*sends[i]) || sends[i]->status != UCS_OK)
      fail(FLATMEM_STATUS_PEER_FAILURE, "flatmem_comm_create (rank 0): sending the roster to rank ", i + 1,
           " failed (", where, ")");
  for (std::size_t i = 0; i < eps.size(); ++i) {
    boot_eps.push_back(eps[i]);
    boot_infos.push_back(std::move(infos[i]));
  }
  Mesh mesh = connect_mesh(engine, 0, roster, deadline, where);
  return finish(std::move(coordinator->engine), 0, world, std::move(mesh), std::move(boot_eps),
                std::move(boot_infos), config);
}

std::unique_ptr<UcxCommunicator> bootstrap_member(const SocketAddress &coordinator, int rank,
                                                  int world, std::uint64_t session,
                                                  const Config &config) {
  auto engine = std::make_unique<Engine>();
  const std::string where = "coordinator " + coordinator.text();
  const auto deadline = Clock::now() + config.connect_timeout;
  const auto hello_bytes = encode(Hello{session, rank, world, engine->worker_address()});
  std::vector<char> roster_buffer(std::size_t(world) * 4096 + 64), reject_buffer(reject_capacity);
  auto roster = engine->post_recv(0, roster_buffer.data(), roster_buffer.size(), boot_tag(0, Boot::roster));
  auto reject = engine->post_recv(0, reject_buffer.data(), reject_buffer.size(), boot_tag(0, Boot::reject));

  std::vector<ucp_ep_h> boot_eps;
  std::vector<std::unique_ptr<EndpointInfo>> boot_infos;
  // On a failure below, close the endpoint to the coordinator before the engine's worker
  // is destroyed: UCX aborts the process ("pending request ... should have been flushed")
  // when a worker goes under an endpoint whose connection is still being set up (a
  // coordinator that did not answer within the connect timeout).
  struct CloseOnFailure {
    Engine &engine;
    std::vector<ucp_ep_h> &eps;
    bool armed = true;
    ~CloseOnFailure() {
      if (armed)
        for (ucp_ep_h ep : eps) engine.close_now(ep);
    }
  } close_on_failure{*engine, boot_eps};
  std::string last_failure = "no answer";
  bool connected = false;
  while (!engine->finished(*roster) && !engine->finished(*reject) && Clock::now() < deadline) {
    auto info = std::make_unique<EndpointInfo>();
    info->peer = -1;
    ucp_ep_h ep = engine->connect_to_sockaddr(coordinator.get(), coordinator.length, info.get());
    if (ep != nullptr) {
      auto hello = engine->post_send(ep, 0, hello_bytes.data(), hello_bytes.size(), boot_tag(rank, Boot::hello));
      engine->progress_until(
          [&] { return engine->finished(*roster) || engine->finished(*reject) || info->failure != UCS_OK; },
          deadline);
      if (engine->finished(*hello) && hello->status == UCS_OK) connected = true;
      if (info->failure == UCS_OK || engine->finished(*roster) || engine->finished(*reject)) {
        boot_eps.push_back(ep);
        boot_infos.push_back(std::move(info));
        break;
      }
      last_failure = ucs_text(info->failure);
      engine->close_now(ep);
      engine->progress_until([&] { return engine->finished(*hello); }, Clock::now() + std::chrono::milliseconds(200));
    } else {
      last_failure = ucs_text(info->failure);
    }
    std::this_thread::sleep_for(retry_pause);
  }
  Reject refused;
  if (engine->finished(*reject) && decode(reject_buffer, reject->received, &refused))
    fail(refused.status, "flatmem_comm_create (rank ", rank, "): ", where, " refused this rank: ", refused.reason);
  std::vector<std::vector<char>> addresses;
  if (!engine->finished(*roster)) {
    if (!connected)
      fail(FLATMEM_STATUS_TIMEOUT, "flatmem_comm_create (rank ", rank, "): could not reach the ", where,
           " within ", config.connect_timeout.count(), " ms (last error: ", last_failure, ")");
    fail(FLATMEM_STATUS_TIMEOUT, "flatmem_comm_create (rank ", rank, "): joined the ", where,
         " but the group did not complete within ", config.connect_timeout.count(),
         " ms (other ranks missing?)");
  }
  if (roster->status != UCS_OK || !decode(roster_buffer, roster->received, &addresses) ||
      int(addresses.size()) != world)
    fail(FLATMEM_STATUS_PEER_FAILURE, "flatmem_comm_create (rank ", rank, "): a malformed roster from the ", where);
  Mesh mesh = connect_mesh(*engine, rank, addresses, deadline, where);
  close_on_failure.armed = false;  // finish() owns the endpoints now
  return finish(std::move(engine), rank, world, std::move(mesh), std::move(boot_eps), std::move(boot_infos),
                config);
}

}  // namespace flatmem::comm::ucx
