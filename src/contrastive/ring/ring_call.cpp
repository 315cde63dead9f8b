// The ring's C API calls: this rank's argument checks (those that do not need
// the other ranks), the agreement of all ranks (agreement.hpp), then the ring.
// A failure after the agreement leaves the ranks out of step, so it poisons the
// communicator (the transport's own errors already did) before it propagates.
#include <chrono>
#include <cstring>
#include <vector>

#include "comm/device_transport.hpp"
#include "contrastive/handle.hpp"
#include "contrastive/ring/cuda/ring_cuda.hpp"
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

bool on_cuda(const Inputs &in) { return in.q.device.device_type == kDLCUDA; }

std::uint32_t bits_of(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

// host_labels: in.labels as the host can read them (a copy for CUDA tensors).
RankEntry entry_of(const Options &options, const Inputs &in, const std::int64_t *host_labels) {
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
    e.label_min = i == 0 ? host_labels[i] : std::min(e.label_min, host_labels[i]);
    e.label_max = i == 0 ? host_labels[i] : std::max(e.label_max, host_labels[i]);
  }
  return e;
}

// The local checks of the tensors' device: on CUDA, the device transport,
// that `outputs` and the inputs are memory of q's device, and the scalars and
// labels read to the host (ring_cuda.hpp); on the CPU the values are already
// there. Returns the labels as the host reads them (labels_copy keeps them).
const std::int64_t *device_checks(comm::Communicator &comm, Inputs &in, void *stream,
                                  std::initializer_list<NamedPointer> outputs,
                                  std::vector<std::int64_t> &labels_copy, const float *dloss_data = nullptr,
                                  float *dloss = nullptr, const float *bias_data = nullptr,
                                  float *bias = nullptr) {
  if (!on_cuda(in)) return in.labels;
  check_device_tensors(comm, in.q.device.device_id, outputs);
  labels_copy = read_device_inputs(comm, in, stream, dloss_data, dloss, bias_data, bias);
  return labels_copy.data();
}

// Fails the communicator: poisoned (the ranks are out of step), and its NCCL
// transport aborted, so that no transfer of the ring stays queued on a stream.
void fail_communicator(comm::Communicator &comm, flatmem_status status, const std::string &message) {
  comm.poison(status, message);
  if (comm::DeviceTransport *device = comm.device()) device->abort();
}

// Runs the ring, timing it; any failure fails the communicator first.
template <typename Ring>
void run_guarded(comm::Communicator &comm, Stats &stats, const char *call, Ring &&ring) {
  const auto start = std::chrono::steady_clock::now();
  stats = Stats{};
  try {
    ring();
  } catch (const Error &e) {
    fail_communicator(comm, e.status(),
                      std::string(call) + " failed on rank " + std::to_string(comm.rank()) + ": " + e.what());
    throw;
  } catch (const std::exception &e) {
    fail_communicator(comm, FLATMEM_STATUS_INTERNAL,
                      std::string(call) + " failed on rank " + std::to_string(comm.rank()) + ": " + e.what());
    throw;
  }
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

void forward(flatmem_contrastive_s &h, const DLTensor *q, const DLTensor *k, const DLTensor *labels,
             const DLTensor *logit_scale, DLTensor *loss, DLTensor *row_lse, DLTensor *col_lse,
             const void *workspace, std::size_t workspace_bytes, void *stream) {
  comm::Communicator &comm = communicator_of(h);
  Inputs in;
  ForwardOutputs out;
  const Layout layout = agree(comm, "contrastive forward", [&] {
    refuse_workspace(workspace, workspace_bytes);
    in = check_inputs(h.options, q, k, labels, logit_scale, Scope::ring);
    out = check_forward_outputs(in, loss, row_lse, col_lse);
    std::vector<std::int64_t> labels_copy;
    const std::int64_t *host_labels = device_checks(
        comm, in, stream, {{out.loss, "loss"}, {out.row_lse, "row_lse"}, {out.col_lse, "col_lse"}}, labels_copy);
    if (h.options.nonfinite == FLATMEM_NONFINITE_ERROR) check_features_finite(in);
    return entry_of(h.options, in, host_labels);
  });
  in.row_offset = layout.row_offset[std::size_t(layout.rank)];
  run_guarded(comm, h.ring_forward_stats, "contrastive forward ring", [&] {
    if (on_cuda(in))
      run_forward_cuda(h, comm, layout, in, out, stream, h.ring_forward_stats);
    else
      run_forward(h, comm, layout, in, out, h.ring_forward_stats);
  });
}

void backward(flatmem_contrastive_s &h, const DLTensor *q, const DLTensor *k,
              const DLTensor *labels, const DLTensor *logit_scale, const DLTensor *row_lse,
              const DLTensor *col_lse, const DLTensor *dloss, DLTensor *dq, DLTensor *dk,
              DLTensor *dlogit_scale, const void *workspace, std::size_t workspace_bytes,
              void *stream) {
  comm::Communicator &comm = communicator_of(h);
  Inputs in;
  BackwardArgs args;
  const Layout layout = agree(comm, "contrastive backward", [&] {
    refuse_workspace(workspace, workspace_bytes);
    in = check_inputs(h.options, q, k, labels, logit_scale, Scope::ring);
    args = check_backward_args(h.options, in, row_lse, col_lse, dloss, dq, dk, dlogit_scale);
    std::vector<std::int64_t> labels_copy;
    const std::int64_t *host_labels = device_checks(
        comm, in, stream,
        {{args.row_lse, "row_lse"}, {args.col_lse, "col_lse"}, {args.dq.data, "dq"}, {args.dk.data, "dk"},
         {args.dscale, "dlogit_scale"}},
        labels_copy, args.dloss_data, &args.dloss);
    if (h.options.nonfinite == FLATMEM_NONFINITE_ERROR) check_features_finite(in);
    RankEntry e = entry_of(h.options, in, host_labels);
    e.dloss_bits = bits_of(args.dloss);
    e.wants_dk = args.dk.data != nullptr;
    return e;
  });
  in.row_offset = layout.row_offset[std::size_t(layout.rank)];
  run_guarded(comm, h.ring_backward_stats, "contrastive backward ring", [&] {
    if (on_cuda(in))
      run_backward_cuda(h, comm, layout, in, args, stream, h.ring_backward_stats);
    else
      run_backward(h, comm, layout, in, args, h.ring_backward_stats);
  });
}

void sigmoid(flatmem_contrastive_s &h, const char *call,
             const std::function<void(Inputs &, SigmoidArgs &)> &local_check,
             const void *workspace, std::size_t workspace_bytes, void *stream) {
  comm::Communicator &comm = communicator_of(h);
  Inputs in;
  SigmoidArgs args;
  const Layout layout = agree(comm, call, [&] {
    refuse_workspace(workspace, workspace_bytes);
    local_check(in, args);
    std::vector<std::int64_t> labels_copy;
    const std::int64_t *host_labels = device_checks(
        comm, in, stream,
        {{args.loss, "loss"}, {args.dq.data, "dq"}, {args.dk.data, "dk"}, {args.dscale, "dlogit_scale"},
         {args.dbias, "dlogit_bias"}},
        labels_copy, args.dloss_data, &args.dloss, args.bias_data, &args.bias);
    if (h.options.nonfinite == FLATMEM_NONFINITE_ERROR) check_features_finite(in);
    RankEntry e = entry_of(h.options, in, host_labels);
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
  run_guarded(comm, stats, phase, [&] {
    if (on_cuda(in))
      run_sigmoid_cuda(h, comm, layout, in, args, phase, stream, stats);
    else
      run_sigmoid(h, comm, layout, in, args, phase, stats);
  });
}

}  // namespace flatmem::contrastive::ring
