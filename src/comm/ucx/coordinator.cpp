#include "comm/ucx/coordinator.hpp"

#include <netinet/in.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>

#include "comm/ucx/tags.hpp"
#include "core/error.hpp"

namespace flatmem::comm::ucx {
namespace {

constexpr char id_magic[8] = {'F', 'L', 'M', 'C', 'O', 'M', 'M', '1'};

// The id's bytes, in this order (host byte order; all supported hosts are
// little-endian).
struct IdLayout {
  char magic[8];
  std::uint32_t version;
  std::uint32_t address_length;
  std::uint64_t session;
  unsigned char address[sizeof(sockaddr_in6)];
};
static_assert(sizeof(IdLayout) <= FLATMEM_COMM_UNIQUE_ID_BYTES);

void on_connection(ucp_conn_request_h request, void *arg) {
  auto *c = static_cast<Coordinator *>(arg);
  std::lock_guard lock(c->mutex);
  c->requests.push_back(request);
}

std::mutex registry_mutex;
// Never destroyed: listeners left at exit are reclaimed by the OS, not by
// static destructors racing UCX's own.
std::map<std::uint64_t, std::unique_ptr<Coordinator>> &registry() {
  static auto *map = new std::map<std::uint64_t, std::unique_ptr<Coordinator>>();
  return *map;
}

}  // namespace

flatmem_comm_unique_id encode_id(const IdContents &contents) {
  IdLayout layout{};
  std::memcpy(layout.magic, id_magic, sizeof id_magic);
  layout.version = FLATMEM_VERSION;
  layout.address_length = contents.address.length;
  layout.session = contents.session;
  std::memcpy(layout.address, &contents.address.storage,
              std::min<std::size_t>(contents.address.length, sizeof layout.address));
  flatmem_comm_unique_id id{};
  std::memcpy(id.internal, &layout, sizeof layout);
  return id;
}

IdContents decode_id(const flatmem_comm_unique_id &id) {
  IdLayout layout;
  std::memcpy(&layout, id.internal, sizeof layout);
  if (std::memcmp(layout.magic, id_magic, sizeof id_magic) != 0)
    invalid("id: not a flatmem communicator id (make it with flatmem_comm_unique_id_create)");
  if (layout.version != FLATMEM_VERSION)
    invalid("id: made by flatmem ", layout.version, ", this is ", FLATMEM_VERSION);
  if (layout.address_length == 0 || layout.address_length > sizeof layout.address)
    invalid("id: corrupt address length ", layout.address_length);
  IdContents contents;
  contents.session = layout.session;
  std::memcpy(&contents.address.storage, layout.address, layout.address_length);
  contents.address.length = layout.address_length;
  const auto family = contents.address.storage.ss_family;
  if (family != AF_INET && family != AF_INET6) invalid("id: corrupt address family ", family);
  return contents;
}

std::uint64_t random_session() {
  std::random_device device;
  std::uint64_t value = 0;
  while (value == 0) value = (std::uint64_t(device()) << 32) ^ device();
  return value;
}

std::vector<ucp_conn_request_h> Coordinator::take_requests() {
  std::lock_guard lock(mutex);
  std::vector<ucp_conn_request_h> taken;
  taken.swap(requests);
  return taken;
}

Coordinator::~Coordinator() { close_listener(); }

void Coordinator::close_listener() {
  if (listener == nullptr) return;
  for (ucp_conn_request_h r : take_requests()) ucp_listener_reject(listener, r);
  ucp_listener_destroy(listener);
  listener = nullptr;
}

std::unique_ptr<Coordinator> listen(const SocketAddress &where, const char *what) {
  auto c = std::make_unique<Coordinator>();
  c->engine = std::make_unique<Engine>();
  ucp_listener_params_t params{};
  params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  params.sockaddr.addr = where.get();
  params.sockaddr.addrlen = where.length;
  params.conn_handler.cb = on_connection;
  params.conn_handler.arg = c.get();
  const ucs_status_t status = ucp_listener_create(c->engine->worker(), &params, &c->listener);
  if (status == UCS_ERR_BUSY)
    invalid(what, ": cannot listen on ", where.text(), ": the port is already in use");
  if (status != UCS_OK)
    invalid(what, ": cannot listen on ", where.text(), ": ", ucs_text(status),
            " (is the address local? UCX_TLS must include tcp)");
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  if (ucp_listener_query(c->listener, &attr) != UCS_OK)
    fail(FLATMEM_STATUS_INTERNAL, what, ": ucp_listener_query failed");
  c->bound = where;
  c->bound.set_port(SocketAddress{attr.sockaddr, where.length}.port());
  return c;
}

void register_coordinator(std::uint64_t session, std::unique_ptr<Coordinator> coordinator) {
  std::lock_guard lock(registry_mutex);
  registry()[session] = std::move(coordinator);
}

std::unique_ptr<Coordinator> adopt_coordinator(std::uint64_t session) {
  std::lock_guard lock(registry_mutex);
  auto found = registry().find(session);
  if (found == registry().end()) return nullptr;
  auto c = std::move(found->second);
  registry().erase(found);
  return c;
}

}  // namespace flatmem::comm::ucx
