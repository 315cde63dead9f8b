#include "ring_registry.hpp"

#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "handle_pool.hpp"

namespace flatmem_jax {

struct CommSlot {
  std::mutex mutex;
  flatmem_comm_t *comm = nullptr;  // NULL once closed
  // The ring handles made so far, by (loss, options.fp32_precision).
  // by (loss, fp32_precision, CUDA tensors)
  std::map<std::tuple<int, std::int64_t, bool>, flatmem_contrastive_t *> handles;
};

namespace {

struct Registry {
  std::mutex mutex;
  std::vector<std::unique_ptr<CommSlot>> slots;  // only ever appended: slot pointers stay valid
};

Registry &registry() {
  static Registry *r = new Registry;  // leaked: no static destructor may join threads
  return *r;
}

CommSlot *find_slot(std::int64_t slot) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  if (slot < 0 || static_cast<std::size_t>(slot) >= registry().slots.size()) return nullptr;
  return registry().slots[static_cast<std::size_t>(slot)].get();
}

std::string unknown(std::int64_t slot) {
  return "comm: no communicator has slot " + std::to_string(slot) +
         " in this process (create one with flatmem_jax.ring.initialize)";
}

std::string closed(std::int64_t slot) {
  return "comm: the communicator of slot " + std::to_string(slot) +
         " was closed (RingComm.close / abort); create a new one";
}

}  // namespace

std::int64_t register_comm(flatmem_comm_t *comm) {
  auto slot = std::make_unique<CommSlot>();
  slot->comm = comm;
  std::lock_guard<std::mutex> lock(registry().mutex);
  registry().slots.push_back(std::move(slot));
  return static_cast<std::int64_t>(registry().slots.size() - 1);
}

flatmem_status close_comm(std::int64_t index, bool abort, std::string &message) {
  CommSlot *slot = find_slot(index);
  if (slot == nullptr) {
    message = unknown(index);
    return FLATMEM_STATUS_INVALID_ARGUMENT;
  }
  std::lock_guard<std::mutex> lock(slot->mutex);
  if (slot->comm == nullptr) {
    message = closed(index);
    return FLATMEM_STATUS_INVALID_ARGUMENT;
  }
  // The handles first: they use the communicator (it must outlive them).
  for (auto &entry : slot->handles) flatmem_contrastive_destroy(entry.second);
  slot->handles.clear();
  const flatmem_status status =
      abort ? flatmem_comm_abort(slot->comm) : flatmem_comm_destroy(slot->comm);
  slot->comm = nullptr;
  if (status != FLATMEM_STATUS_SUCCESS) message = flatmem_last_error();
  return status;
}

RingLease::RingLease(std::int64_t index) : slot_(find_slot(index)) {
  if (slot_ == nullptr) {
    status_ = FLATMEM_STATUS_INVALID_ARGUMENT;
    message_ = unknown(index);
    return;
  }
  lock_ = std::unique_lock<std::mutex>(slot_->mutex);
  if (slot_->comm == nullptr) {
    status_ = FLATMEM_STATUS_INVALID_ARGUMENT;
    message_ = closed(index);
  }
}

flatmem_comm_t *RingLease::comm() const {
  return status_ == FLATMEM_STATUS_SUCCESS ? slot_->comm : nullptr;
}

flatmem_status RingLease::handle(flatmem_contrastive_loss loss, std::int64_t fp32_precision, bool on_cuda,
                                 flatmem_contrastive_t **out) {
  if (status_ != FLATMEM_STATUS_SUCCESS) return status_;
  const std::tuple<int, std::int64_t, bool> key{static_cast<int>(loss), fp32_precision, on_cuda};
  auto found = slot_->handles.find(key);
  if (found != slot_->handles.end()) {
    *out = found->second;
    return FLATMEM_STATUS_SUCCESS;
  }
  flatmem_contrastive_options options;
  flatmem_status status = flatmem_contrastive_options_init(&options, sizeof(flatmem_contrastive_options));
  if (status != FLATMEM_STATUS_SUCCESS) return status;
  options.loss = loss;
  options.num_threads = pool_num_threads();
  options.fp32_precision = fp32_precision;  // flatmem_contrastive_create judges the value
  options.comm = slot_->comm;
  // CUDA tensors run under PROPAGATE (flatmem scans no device memory on the host)
  if (on_cuda) options.nonfinite = FLATMEM_NONFINITE_PROPAGATE;
  flatmem_contrastive_t *handle = nullptr;
  status = flatmem_contrastive_create(&handle, &options);
  if (status != FLATMEM_STATUS_SUCCESS) return status;
  try {
    slot_->handles.emplace(key, handle);
  } catch (...) {  // no memory to keep it: let it go (the next call makes it again)
    flatmem_contrastive_destroy(handle);
    return FLATMEM_STATUS_OUT_OF_MEMORY;
  }
  *out = handle;
  return FLATMEM_STATUS_SUCCESS;
}

}  // namespace flatmem_jax
