// Rank 0's side of the bootstrap before its communicator exists: a UCX
// listener on a socket address, and the unique id that describes it. The id
// is made by flatmem_comm_unique_id_create; the listener waits in a registry
// until rank 0's flatmem_comm_create adopts it (matched by the id's session
// number).
#pragma once

#include <flatmem/flatmem.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "comm/ucx/address.hpp"
#include "comm/ucx/engine.hpp"

namespace flatmem::comm::ucx {

struct IdContents {
  std::uint64_t session = 0;  // random per id; 0 (environment launches) matches any
  SocketAddress address;      // what the other ranks dial
};

flatmem_comm_unique_id encode_id(const IdContents &contents);
// INVALID_ARGUMENT ("id: ...") unless it is an id of this flatmem version.
IdContents decode_id(const flatmem_comm_unique_id &id);
std::uint64_t random_session();

struct Coordinator {
  std::unique_ptr<Engine> engine;
  ucp_listener_h listener = nullptr;
  SocketAddress bound;  // the address listened on, port filled in

  // Connection requests that arrived (UCX calls back on its own schedule).
  std::mutex mutex;
  std::vector<ucp_conn_request_h> requests;
  std::vector<ucp_conn_request_h> take_requests();

  // Stops listening (connection requests not taken are rejected).
  void close_listener();
  ~Coordinator();
};

// Listens on `where` (port 0: any free port). INVALID_ARGUMENT naming `what`
// and the address when the port is in use or the address is not local.
std::unique_ptr<Coordinator> listen(const SocketAddress &where, const char *what);

void register_coordinator(std::uint64_t session, std::unique_ptr<Coordinator> coordinator);
// The registered coordinator of `session`, removed from the registry; nullptr if none.
std::unique_ptr<Coordinator> adopt_coordinator(std::uint64_t session);

}  // namespace flatmem::comm::ucx
