// Small helpers around the contrastive-loss C API for the tests: an owning
// handle, option builders, a guarded workspace buffer and the conversion of
// test tensors into a reference problem.
#pragma once

#include <flatmem/flatmem.h>

#include <cstdint>
#include <memory>
#include <string>

#include "support/reference.hpp"
#include "support/tensor.hpp"

namespace flatmem_test {

struct HandleDeleter {
  void operator()(flatmem_contrastive_t *h) const { flatmem_contrastive_destroy(h); }
};
using Handle = std::unique_ptr<flatmem_contrastive_t, HandleDeleter>;

/** Options from the INIT macro with the given fields (0 = default). */
flatmem_contrastive_options make_options(flatmem_contrastive_loss loss, int threads = 0, int tile_rows = 0,
                                         int tile_cols = 0,
                                         flatmem_nonfinite_policy nonfinite = FLATMEM_NONFINITE_ERROR);

/** Creates a handle; throws std::runtime_error (a test failure) if it fails. */
Handle create_handle(const flatmem_contrastive_options &options);

/** "FLATMEM_STATUS_X: <last error>" for failure messages. */
std::string describe(flatmem_status status);

/** A workspace of `bytes` usable bytes starting `misalign` bytes past a
 *  64-byte boundary, with guard bytes on both sides to catch any write
 *  outside [data(), data() + bytes). */
class GuardedBuffer {
 public:
  GuardedBuffer(std::size_t bytes, std::size_t misalign = 0);
  void *data() const { return data_; }
  std::size_t size() const { return bytes_; }
  bool guards_intact() const;

 private:
  static constexpr std::size_t guard = 256;
  static constexpr unsigned char guard_byte = 0xCD;
  std::unique_ptr<unsigned char[]> storage_;
  unsigned char *data_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t before_ = 0;
};

/** The reference problem for these tensors (values read back exactly as
 *  stored, i.e. after rounding to their dtype). labels may be NULL. */
ReferenceProblem reference_problem(bool symmetric, const HostTensor &q, const HostTensor &k,
                                   const HostTensor *labels, const HostTensor &scale, double dloss);

}  // namespace flatmem_test
