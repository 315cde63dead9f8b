// extern "C" entry points of communicators: argument checks, then the
// communicator (src/comm/); exceptions become statuses. flatmem_comm_create_local
// is in comm_local.cpp.
#include <cstring>
#include <memory>
#include <string>

#include "comm/create.hpp"
#include "comm/device_transport.hpp"
#include "comm/message.hpp"
#include "comm/options.hpp"
#include "core/abi_struct.hpp"
#include "core/error.hpp"
#include "core/options.hpp"

using namespace flatmem;
using namespace flatmem::comm;

// A request handed to the caller: a host transfer, or a device transfer that
// was complete once enqueued.
struct flatmem_comm_request_s {
  TransferPtr transfer;  // nullptr for device transfers
  std::string what;
};

namespace {

Communicator &get(const flatmem_comm_t *comm) {
  if (comm == nullptr || comm->impl == nullptr)
    invalid("comm: NULL (create one with flatmem_comm_create)");
  return *comm->impl;
}

void check_out(const void *p, const char *name) {
  if (p == nullptr) invalid(name, ": NULL");
}

void check_peer(const Communicator &c, std::int32_t peer) {
  if (peer < 0 || peer >= c.size())
    invalid("peer: ", peer, "; expected 0 .. ", c.size() - 1, " (world size ", c.size(), ")");
}

Milliseconds timeout_of(const Communicator &c, std::int64_t timeout_ms) {
  return resolve_timeout(timeout_ms, c.default_timeout(), "timeout_ms");
}

// The device transport for a kDLCUDA message, or INVALID_ARGUMENT / UNSUPPORTED.
DeviceTransport &device_for(const Communicator &c, const Message &m, const char *name) {
  if (!device_transport_built())
    fail(FLATMEM_STATUS_UNSUPPORTED, name,
         ": a kDLCUDA buffer, but this flatmem was built without NCCL (FLATMEM_WITH_NCCL)");
  DeviceTransport *device = c.device();
  if (device == nullptr)
    invalid(name, ": a kDLCUDA buffer, but flatmem_comm_init_device was not called on this communicator");
  if (m.device.device_id != device->device())
    invalid(name, ": on CUDA device ", m.device.device_id, "; the communicator's device transport is on device ",
            device->device());
  return *device;
}

bool is_device(const Message &m) { return m.device.device_type == kDLCUDA; }

std::string op(const char *name, std::int32_t peer, std::uint32_t tag) {
  return std::string(name) + "(peer " + std::to_string(peer) + ", tag " + std::to_string(tag) + ")";
}

SumType host_sum_type(const DLDataType &t, const char *name) {
  if (t.code == kDLFloat && t.bits == 32) return SumType::f32;
  if (t.code == kDLFloat && t.bits == 64) return SumType::f64;
  if (t.code == kDLInt && t.bits == 32) return SumType::i32;
  if (t.code == kDLInt && t.bits == 64) return SumType::i64;
  invalid(name, ": dtype (code ", int(t.code), ", bits ", int(t.bits),
          "); host all_reduce sums fp32, fp64, int32 or int64");
}

// The host all-reduce reads and adds elements in place: their address must
// suit the element type (a misaligned float is undefined behaviour in C++).
void check_element_aligned(const Message &m, const char *name) {
  const std::uintptr_t element = m.dtype.bits / 8, address = reinterpret_cast<std::uintptr_t>(m.data);
  if (m.bytes > 0 && address % element != 0)
    invalid(name, ": data + byte_offset = ", address, " is not a multiple of the element size (",
            element, " bytes); the host all_reduce adds elements in place");
}

DeviceSumType device_sum_type(const DLDataType &t, const char *name) {
  if (t.code == kDLFloat && t.bits == 32) return DeviceSumType::f32;
  if (t.code == kDLFloat && t.bits == 64) return DeviceSumType::f64;
  if (t.code == kDLFloat && t.bits == 16) return DeviceSumType::f16;
  if (t.code == kDLBfloat && t.bits == 16) return DeviceSumType::bf16;
  if (t.code == kDLInt && t.bits == 32) return DeviceSumType::i32;
  if (t.code == kDLInt && t.bits == 64) return DeviceSumType::i64;
  invalid(name, ": dtype (code ", int(t.code), ", bits ", int(t.bits),
          "); device all_reduce sums fp32, fp64, fp16, bf16, int32 or int64");
}

// send / recv of one collective: same device, same byte size (and dtype when `same_dtype`).
void check_pair(const Message &send, const Message &recv, bool same_dtype) {
  if (send.device.device_type != recv.device.device_type || send.device.device_id != recv.device.device_id)
    invalid("recv: on device (", int(recv.device.device_type), ", ", recv.device.device_id,
            "), send on (", int(send.device.device_type), ", ", send.device.device_id, ")");
  if (send.bytes != recv.bytes)
    invalid("recv: ", recv.bytes, " bytes; send has ", send.bytes, " (they must match)");
  if (same_dtype && (send.dtype.code != recv.dtype.code || send.dtype.bits != recv.dtype.bits))
    invalid("recv: dtype differs from send's");
}

enum class Direction { send, recv };

// flatmem_comm_isend / _irecv: host transfers through the communicator,
// device ones enqueued through NCCL (complete once enqueued).
void post(flatmem_comm_t *comm, const DLTensor *buffer, std::int32_t peer, std::uint32_t tag,
          flatmem_comm_request_t **request, void *stream, Direction direction) {
  Communicator &c = get(comm);
  const Message m = check_message(buffer, "buffer");
  check_peer(c, peer);
  check_out(request, "request");
  c.check_healthy();
  const bool sending = direction == Direction::send;
  auto r = std::make_unique<flatmem_comm_request_s>();
  r->what = op(sending ? "flatmem_comm_isend" : "flatmem_comm_irecv", peer, tag);
  if (is_device(m)) {
    DeviceTransport &device = device_for(c, m, "buffer");
    if (sending) device.send(m.data, m.bytes, peer, stream, c.default_timeout());
    else device.recv(m.data, m.bytes, peer, stream, c.default_timeout());
  } else {
    r->transfer = sending ? c.send(peer, m.data, m.bytes, Space::user, tag)
                          : c.recv(peer, m.data, m.bytes, Space::user, tag);
  }
  *request = r.release();
}

// The device transport for the group / synchronize calls, or the reason there is none.
DeviceTransport &device_transport(Communicator &c, const char *function) {
  if (!device_transport_built())
    fail(FLATMEM_STATUS_UNSUPPORTED, function, ": this flatmem was built without NCCL (FLATMEM_WITH_NCCL)");
  if (c.device() == nullptr)
    invalid(function, ": no device transport on this communicator (call flatmem_comm_init_device first)");
  c.check_healthy();
  return *c.device();
}

}  // namespace

extern "C" {

flatmem_status flatmem_comm_options_init(flatmem_comm_options *options, size_t struct_size) {
  return guarded([&] {
    init_struct(options, struct_size, flatmem_comm_options FLATMEM_COMM_OPTIONS_INIT, "options");
  });
}

flatmem_status flatmem_comm_unique_id_create(const char *address, flatmem_comm_unique_id *id) {
  return guarded([&] {
    check_out(id, "id");
    *id = make_unique_id(address);
  });
}

flatmem_status flatmem_comm_create(flatmem_comm_t **out, int32_t rank, int32_t world_size,
                                   const flatmem_comm_unique_id *id,
                                   const flatmem_comm_options *options) {
  return guarded([&] {
    check_out(out, "out");
    check_out(id, "id");
    if (world_size < 1 || world_size > (1 << 20))
      invalid("world_size: ", world_size, "; expected 1 .. ", 1 << 20);
    if (rank < 0 || rank >= world_size)
      invalid("rank: ", rank, "; expected 0 .. ", world_size - 1, " (world_size ", world_size, ")");
    const Config config = resolve_config(options);
    auto handle = std::make_unique<flatmem_comm_s>();
    handle->impl = create_ucx(rank, world_size, *id, config);
    *out = handle.release();
  });
}

flatmem_status flatmem_comm_create_from_env(flatmem_comm_t **out, const flatmem_comm_options *options) {
  return guarded([&] {
    check_out(out, "out");
    const Config config = resolve_config(options);
    auto handle = std::make_unique<flatmem_comm_s>();
    handle->impl = create_ucx_from_env(config);
    *out = handle.release();
  });
}

flatmem_status flatmem_comm_destroy(flatmem_comm_t *comm) {
  return guarded([&] { delete comm; });
}

flatmem_status flatmem_comm_abort(flatmem_comm_t *comm) {
  return guarded([&] {
    if (comm == nullptr) return;
    std::unique_ptr<flatmem_comm_s> owned(comm);
    if (owned->impl && owned->impl->device()) owned->impl->device()->abort();
    if (owned->impl && owned->impl->health(nullptr) == FLATMEM_STATUS_SUCCESS)
      owned->impl->poison(FLATMEM_STATUS_PEER_FAILURE, "flatmem_comm_abort was called");
  });
}

flatmem_status flatmem_comm_rank(const flatmem_comm_t *comm, int32_t *rank) {
  return guarded([&] {
    const Communicator &c = get(comm);
    check_out(rank, "rank");
    *rank = c.rank();
  });
}

flatmem_status flatmem_comm_world_size(const flatmem_comm_t *comm, int32_t *world_size) {
  return guarded([&] {
    const Communicator &c = get(comm);
    check_out(world_size, "world_size");
    *world_size = c.size();
  });
}

flatmem_status flatmem_comm_health(const flatmem_comm_t *comm) {
  return guarded([&] {
    std::string message;
    const flatmem_status status = get(comm).health(&message);
    if (status != FLATMEM_STATUS_SUCCESS) throw Error(status, message);
  });
}

flatmem_status flatmem_comm_isend(flatmem_comm_t *comm, const DLTensor *buffer, int32_t peer,
                                  uint32_t tag, flatmem_comm_request_t **request, void *stream) {
  return guarded([&] { post(comm, buffer, peer, tag, request, stream, Direction::send); });
}

flatmem_status flatmem_comm_irecv(flatmem_comm_t *comm, DLTensor *buffer, int32_t peer,
                                  uint32_t tag, flatmem_comm_request_t **request, void *stream) {
  return guarded([&] { post(comm, buffer, peer, tag, request, stream, Direction::recv); });
}

flatmem_status flatmem_comm_wait(flatmem_comm_t *comm, flatmem_comm_request_t *request,
                                 int64_t timeout_ms) {
  return guarded([&] {
    Communicator &c = get(comm);
    if (request == nullptr) invalid("request: NULL");
    std::unique_ptr<flatmem_comm_request_s> owned(request);
    const Milliseconds timeout = timeout_of(c, timeout_ms);
    if (owned->transfer) c.wait(owned->transfer, timeout, owned->what);
  });
}

flatmem_status flatmem_comm_test(flatmem_comm_t *comm, flatmem_comm_request_t *request,
                                 int32_t *done) {
  return guarded([&] {
    Communicator &c = get(comm);
    if (request == nullptr) invalid("request: NULL");
    check_out(done, "done");
    *done = !request->transfer || c.test(request->transfer) ? 1 : 0;
  });
}

flatmem_status flatmem_comm_ring_shift(flatmem_comm_t *comm, const DLTensor *send, DLTensor *recv,
                                       int64_t timeout_ms, void *stream) {
  return guarded([&] {
    Communicator &c = get(comm);
    const Message s = check_message(send, "send"), r = check_message(recv, "recv");
    check_pair(s, r, false);
    if (overlaps(s, r)) invalid("recv: overlaps send (ring_shift needs distinct buffers)");
    const Milliseconds timeout = timeout_of(c, timeout_ms);
    c.check_healthy();
    if (is_device(s)) device_for(c, s, "send").ring_shift(s.data, r.data, s.bytes, stream, timeout);
    else c.ring_shift(s.data, r.data, s.bytes, timeout, "flatmem_comm_ring_shift");
  });
}

flatmem_status flatmem_comm_all_reduce(flatmem_comm_t *comm, const DLTensor *send, DLTensor *recv,
                                       int64_t timeout_ms, void *stream) {
  return guarded([&] {
    Communicator &c = get(comm);
    const Message s = check_message(send, "send"), r = check_message(recv, "recv");
    check_pair(s, r, true);
    if (s.data != r.data && overlaps(s, r))
      invalid("recv: partially overlaps send (pass the same buffer for in place, or distinct ones)");
    const Milliseconds timeout = timeout_of(c, timeout_ms);
    c.check_healthy();
    if (is_device(s))
      device_for(c, s, "send").all_reduce_sum(s.data, r.data, s.count, device_sum_type(s.dtype, "send"),
                                              stream, timeout);
    else {
      const SumType type = host_sum_type(s.dtype, "send");
      check_element_aligned(s, "send");
      check_element_aligned(r, "recv");
      c.all_reduce_sum(s.data, r.data, s.count, type, timeout, "flatmem_comm_all_reduce");
    }
  });
}

flatmem_status flatmem_comm_barrier(flatmem_comm_t *comm, int64_t timeout_ms) {
  return guarded([&] {
    Communicator &c = get(comm);
    const Milliseconds timeout = timeout_of(c, timeout_ms);
    c.barrier(timeout, "flatmem_comm_barrier");
  });
}

flatmem_status flatmem_comm_init_device(flatmem_comm_t *comm, int32_t cuda_device, int64_t timeout_ms) {
  return guarded([&] {
    Communicator &c = get(comm);
    if (cuda_device < 0) invalid("cuda_device: ", cuda_device, "; expected a CUDA device id >= 0");
    const Milliseconds timeout = timeout_of(c, timeout_ms);
    if (!device_transport_built())
      fail(FLATMEM_STATUS_UNSUPPORTED,
           "flatmem_comm_init_device: this flatmem was built without NCCL (FLATMEM_WITH_NCCL)");
    if (c.device() != nullptr)
      invalid("flatmem_comm_init_device: already called on this communicator (device ",
              c.device()->device(), ")");
    c.check_healthy();
    c.set_device(create_device_transport(c, cuda_device, timeout));
  });
}

flatmem_status flatmem_comm_group_start(flatmem_comm_t *comm) {
  return guarded([&] { device_transport(get(comm), "flatmem_comm_group_start").group_start(); });
}

flatmem_status flatmem_comm_group_end(flatmem_comm_t *comm, int64_t timeout_ms) {
  return guarded([&] {
    Communicator &c = get(comm);
    const Milliseconds timeout = timeout_of(c, timeout_ms);
    device_transport(c, "flatmem_comm_group_end").group_end(timeout);
  });
}

flatmem_status flatmem_comm_synchronize(flatmem_comm_t *comm, void *stream, int64_t timeout_ms) {
  return guarded([&] {
    Communicator &c = get(comm);
    const Milliseconds timeout = timeout_of(c, timeout_ms);
    device_transport(c, "flatmem_comm_synchronize").synchronize(stream, timeout);
  });
}

}  // extern "C"
