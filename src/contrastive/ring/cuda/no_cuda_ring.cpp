// Builds without the CUDA backend or NCCL: the ring refuses kDLCUDA tensors.
#include "contrastive/ring/cuda/ring_cuda.hpp"

#include "core/error.hpp"

namespace flatmem::contrastive::ring {
namespace {

[[noreturn]] void refuse() {
  fail(FLATMEM_STATUS_UNSUPPORTED,
       "q: device is kDLCUDA; this libflatmem was built without the CUDA backend or without NCCL, "
       "which the ring loss (options.comm) on CUDA tensors needs");
}

}  // namespace

bool cuda_ring_built() { return false; }

void check_device_tensors(comm::Communicator &, int, std::initializer_list<NamedPointer>) { refuse(); }
std::vector<std::int64_t> read_device_inputs(comm::Communicator &, Inputs &, void *, const float *,
                                             float *, const float *, float *) {
  refuse();
}
void run_forward_cuda(flatmem_contrastive_s &, comm::Communicator &, const Layout &, const Inputs &,
                      const ForwardOutputs &, void *, Stats &) {
  refuse();
}
void run_backward_cuda(flatmem_contrastive_s &, comm::Communicator &, const Layout &, const Inputs &,
                       const BackwardArgs &, void *, Stats &) {
  refuse();
}
void run_sigmoid_cuda(flatmem_contrastive_s &, comm::Communicator &, const Layout &, const Inputs &,
                      const SigmoidArgs &, const char *, void *, Stats &) {
  refuse();
}

}  // namespace flatmem::contrastive::ring
