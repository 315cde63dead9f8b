// The ring's C API calls: this rank's argument checks (those that do not need
// the other ranks), the agreement of all ranks (agreement.hpp), then the ring.
// A failure after the agreement leaves the ranks out of step, so it poisons the
// communicator (the transport's own errors already did) before it propagates.
#include <chrono>
#include <cstring>

#include "contrastive/handle.hpp"
#include "contrastive/ring/ring.hpp"
#include "contrastive/validate.hpp"
#include "core/error.hpp"

namespace flatmem::contrastive::ring {
namespace {

comm::Communicator &communicator_of(const flatmem_contrastive_s &h) { return *h.options.comm->impl; }

void refuse_workspace(const void *workspace, std::size_t bytes) {
  if (workspace != nullptr || bytes != 0)
    invalid("workspace: must be NULL (and workspace_bytes 0) for a handle with a communicator "
            "(options.comm): the ring's transit buffers are sized by the other ranks' shapes, "
            "which this rank learns only inside the call, so the handle keeps its own");
}

void refuse_device(const Inputs &in) {
  if (in.q.device.device_type != kDLCPU)
    fail(FLATMEM_STATUS_UNSUPPORTED,
         "q: device is not kDLCPU; the ring loss (options.comm) runs on CPU tensors in this version");
}

std::uint32_t bits_of(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

RankEntry entry_of(const Options &options, const Inputs &in) {
  RankEntry e;
  e.loss = int(in.loss);  // symmetric 0, infonce 1, sigmoid 2
  e.dtype = int(in.q.dtype);
  e.nonfinite = options.nonfinite;
  e.precision = int(options.fp32_precision);
  e.rows = in.b();
  e.cols = in.c();
  e.d = in.d();
  e.scale_bits = bits_of(in.scale);
  e.has_labels = in.labels != nullptr;
  for (std::int64_t i = 0; i < (in.labels ? in.b() : 0); ++i) {
    e.label_min = i == 0 ? in.labels[i] : std::min(e.label_min, in.labels[i]);
    e.label_max = i == 0 ? in.labels[i] : std::max(e.label_max, in.labels[i]);
  }
  return e;
}

// Runs the ring, timing it; any failure poisons the communicator first.
template <typename Ring>
void run_guarded(comm::Communicator &comm, Stats &stats, const char *call, Ring &&ring) {
  const auto start = std::chrono::steady_clock::now();
  stats = Stats{};
  try {
    ring();
  } catch (const Error &e) {
    comm.poison(e.status(), std::string(call) + " failed on rank " + std::to_string(comm.rank()) +
                                ": " + e.what());
    throw;
  } catch (const std::exception &e) {
    comm.poison(FLATMEM_STATUS_INTERNAL, std::string(call) + " failed on rank " +
                                             std::to_string(comm.rank()) + ": " + e.what());
    throw;
  }
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

void forward(flatmem_contrastive_s &h, const DLTensor *q, const DLTensor *k, const DLTensor *labels,
             const DLTensor *logit_scale, DLTensor *loss, DLTensor *row_lse, DLTensor *col_lse,
             const void *workspace, std::size_t workspace_bytes) {
  comm::Communicator &comm = communicator_of(h);
  Inputs in;
  ForwardOutputs out;
  const Layout layout = agree(comm, "contrastive forward", [&] {
    refuse_workspace(workspace, workspace_bytes);
    in = check_inputs(h.options, q, k, labels, logit_scale, Scope::ring);
    refuse_device(in);
    out = check_forward_outputs(in, loss, row_lse, col_lse);
    if (h.options.nonfinite == FLATMEM_NONFINITE_ERROR) check_features_finite(in);
    return entry_of(h.options, in);
  });
  in.row_offset = layout.row_offset[std::size_t(layout.rank)];
  run_guarded(comm, h.ring_forward_stats, "contrastive forward ring",
              [&] { run_forward(h, comm, layout, in, out, h.ring_forward_stats); });
}

void backward(flatmem_contrastive_s &h, const DLTensor *q, const DLTensor *k,
              const DLTensor *labels, const DLTensor *logit_scale, const DLTensor *row_lse,
              const DLTensor *col_lse, const DLTensor *dloss, DLTensor *dq, DLTensor *dk,
              DLTensor *dlogit_scale, const void *workspace, std::size_t workspace_bytes) {
  comm::Communicator &comm = communicator_of(h);
  Inputs in;
  BackwardArgs args;
  const Layout layout = agree(comm, "contrastive backward", [&] {
    refuse_workspace(workspace, workspace_bytes);
    in = check_inputs(h.options, q, k, labels, logit_scale, Scope::ring);
    refuse_device(in);
    args = check_backward_args(h.options, in, row_lse, col_lse, dloss, dq, dk, dlogit_scale);
    if (h.options.nonfinite == FLATMEM_NONFINITE_ERROR) check_features_finite(in);
    RankEntry e = entry_of(h.options, in);
    e.dloss_bits = bits_of(args.dloss);
    e.wants_dk = args.dk.data != nullptr;
    return e;
  });
  in.row_offset = layout.row_offset[std::size_t(layout.rank)];
  run_guarded(comm, h.ring_backward_stats, "contrastive backward ring",
              [&] { run_backward(h, comm, layout, in, args, h.ring_backward_stats); });
}

void sigmoid(flatmem_contrastive_s &h, const char *call,
             const std::function<void(Inputs &, cpu::SigmoidArgs &)> &local_check,
             const void *workspace, std::size_t workspace_bytes) {
  comm::Communicator &comm = communicator_of(h);
  Inputs in;
  cpu::SigmoidArgs args;
  const Layout layout = agree(comm, call, [&] {
    refuse_workspace(workspace, workspace_bytes);
    local_check(in, args);
    refuse_device(in);
    if (h.options.nonfinite == FLATMEM_NONFINITE_ERROR) check_features_finite(in);
    RankEntry e = entry_of(h.options, in);
    e.bias_bits = bits_of(args.bias);
    e.dloss_bits = bits_of(args.dloss);
    e.wants_dk = args.dk.data != nullptr;
    e.wants_loss = args.loss != nullptr;
    e.wants_dscale = args.dscale != nullptr;
    e.wants_dbias = args.dbias != nullptr;
    return e;
  });
  in.row_offset = layout.row_offset[std::size_t(layout.rank)];
  // the forward's statistics for the loss alone, the backward's when gradients are computed
  Stats &stats = args.wants_gradient() ? h.ring_backward_stats : h.ring_forward_stats;
  const char *phase = "contrastive sigmoid ring";
  run_guarded(comm, stats, phase, [&] { run_sigmoid(h, comm, layout, in, args, phase, stats); });
}

}  // namespace flatmem::contrastive::ring
