#include "support/contrastive.hpp"

#include <cstring>
#include <stdexcept>

namespace flatmem_test {

flatmem_contrastive_options make_options(flatmem_contrastive_loss loss, int threads, int tile_rows,
                                         int tile_cols, flatmem_nonfinite_policy nonfinite) {
  flatmem_contrastive_options o = FLATMEM_CONTRASTIVE_OPTIONS_INIT;
  o.loss = loss;
  o.num_threads = threads;
  o.tile_rows = tile_rows;
  o.tile_cols = tile_cols;
  o.nonfinite = nonfinite;
  return o;
}

Handle create_handle(const flatmem_contrastive_options &options) {
  flatmem_contrastive_t *h = nullptr;
  const flatmem_status status = flatmem_contrastive_create(&h, &options);
  if (status != FLATMEM_STATUS_SUCCESS || h == nullptr)
    throw std::runtime_error("flatmem_contrastive_create failed: " + describe(status));
  return Handle(h);
}

std::string describe(flatmem_status status) {
  return std::string(flatmem_status_string(status)) + ": " + flatmem_last_error();
}

GuardedBuffer::GuardedBuffer(std::size_t bytes, std::size_t misalign) : bytes_(bytes) {
  const std::size_t total = guard + 64 + misalign + bytes + guard;
  storage_.reset(new unsigned char[total]);
  std::memset(storage_.get(), guard_byte, total);
  const auto address = reinterpret_cast<std::uintptr_t>(storage_.get() + guard);
  data_ = storage_.get() + guard + (64 - address % 64) % 64 + misalign;
  before_ = std::size_t(data_ - storage_.get());
  // The usable bytes start as something other than the guard pattern.
  std::memset(data_, 0x3C, bytes_);
}

bool GuardedBuffer::guards_intact() const {
  for (std::size_t i = 0; i < before_; ++i)
    if (storage_[i] != guard_byte) return false;
  const unsigned char *after = data_ + bytes_;
  for (std::size_t i = 0; i < guard; ++i)
    if (after[i] != guard_byte) return false;
  return true;
}

ReferenceProblem reference_problem(bool symmetric, const HostTensor &q, const HostTensor &k,
                                   const HostTensor *labels, const HostTensor &scale, double dloss) {
  ReferenceProblem p;
  p.symmetric = symmetric;
  p.b = q.rows();
  p.c = k.rows();
  p.d = q.cols();
  p.q = q.values();
  p.k = k.values();
  if (labels != nullptr)
    for (std::int64_t i = 0; i < labels->cols(); ++i) p.labels.push_back(std::int64_t(labels->get(i)));
  p.scale = scale.get(0);
  p.dloss = dloss;
  return p;
}

}  // namespace flatmem_test
