// The ring schedule's transport on CUDA tensors: the communicator's NCCL
// device transport. Each exchange is one NCCL group (its receives from rank - 1
// and sends to rank + 1) on a communication stream of its own, ordered after
// the work queued so far on the caller's (compute) stream by an event; waiting
// for an exchange makes the compute stream wait for the group's completion
// event. Nothing blocks the host here except group_end (under the deadline):
// the ring's call synchronises once, at its end (ring_forward_cuda.cpp,
// ring_backward_cuda.cpp, ring_sigmoid_cuda.cpp).
//
// NCCL matches point-to-point transfers by order, not by tag: the schedule
// guarantees that exchange k of rank r sends exactly what exchange k of rank
// r + 1 receives (tests/contrastive/test_ring_schedule.cpp), and each group
// holds matching pairs, so no rank waits on a group its peer issues later.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "comm/device_transport.hpp"
#include "contrastive/ring/stats.hpp"
#include "contrastive/ring/transport.hpp"

namespace flatmem::contrastive::ring {

class NcclRingTransport final : public Transport {
 public:
  // compute: the caller's stream; phase names the ring in messages.
  NcclRingTransport(comm::Communicator &comm, comm::DeviceTransport &device, cudaStream_t compute,
                    const char *phase, Stats &stats);
  ~NcclRingTransport() override;
  NcclRingTransport(const NcclRingTransport &) = delete;
  NcclRingTransport &operator=(const NcclRingTransport &) = delete;

  int ranks() const override { return ranks_; }
  int rank() const override { return rank_; }
  ExchangePtr exchange(int step, std::span<const Outgoing> sends,
                       std::span<const Incoming> receives) override;
  void wait(ExchangePtr &posted) override;

 private:
  comm::Communicator &comm_;
  comm::DeviceTransport &device_;
  cudaStream_t compute_;
  cudaStream_t transfers_ = nullptr;
  const char *phase_;
  Stats &stats_;
  int ranks_, rank_;
};

}  // namespace flatmem::contrastive::ring
