#include "reversible/callbacks.hpp"

#include <string>

#include "core/error.hpp"
#include "reversible/chain.hpp"

namespace flatmem::reversible {
namespace {

thread_local std::string callback_message;

// parallel_for without a chain (size queries): the calling thread alone.
void run_serially(const flatmem_reversible_context *, std::int64_t items,
                  void (*body)(void *, std::int64_t, std::int32_t), void *arg) {
  if (body == nullptr) return;
  for (std::int64_t i = 0; i < items; ++i) body(arg, i, 0);
}

flatmem_reversible_context make_context(const CallSite &site, Chain *chain) {
  flatmem_reversible_context c{};
  c.struct_size = sizeof c;
  c.block = site.block;
  c.part = site.part;
  c.phase = site.phase;
  c.seed = block_seed(site.seed, site.block, site.part);
  c.offset = site.offset;
  c.num_threads = 1;
  c.parallel_for = run_serially;
  if (chain != nullptr) chain->describe(c);
  return c;
}

const char *part_name(flatmem_reversible_part p) { return p == FLATMEM_REVERSIBLE_F ? "F" : "G"; }

const char *phase_name(flatmem_reversible_phase p) {
  switch (p) {
    case FLATMEM_REVERSIBLE_PHASE_FORWARD: return "segment forward";
    case FLATMEM_REVERSIBLE_PHASE_RECORD: return "recording forward";
    case FLATMEM_REVERSIBLE_PHASE_REBUILD: return "rebuild";
    case FLATMEM_REVERSIBLE_PHASE_GRADIENT: return "gradient";
    default: return "?";
  }
}

// Throws for a failing status: the callback's own status when it is one of
// ours, INTERNAL for anything else.
void check_callback(flatmem_status status, const CallSite &site, const char *what) {
  if (status == FLATMEM_STATUS_SUCCESS) return;
  std::string message = callback_message.empty()
                            ? std::string("the callback returned ") + flatmem_status_string(status)
                            : callback_message;
  callback_message.clear();
  const bool known = status > FLATMEM_STATUS_SUCCESS && status <= FLATMEM_STATUS_INTERNAL;
  if (!known) message += " (unknown status " + std::to_string(int(status)) + ")";
  fail(known ? status : FLATMEM_STATUS_INTERNAL, "block ", site.block, ", ", part_name(site.part),
       " ", what, " (", phase_name(site.phase), "): ", message);
}

}  // namespace

std::uint64_t block_seed(std::uint64_t seed, std::int32_t block, std::int32_t part) {
  // SplitMix64's finaliser over seed ^ golden * (2 * block + part + 1).
  std::uint64_t z = seed ^ (0x9E3779B97F4A7C15ull * (2ull * std::uint64_t(std::uint32_t(block)) +
                                                     std::uint64_t(std::uint32_t(part)) + 1ull));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void set_callback_message(const char *message) { callback_message = message ? message : ""; }

void call_forward(const flatmem_reversible_function &fn, const CallSite &site, Chain *chain,
                  const StateLayout &s, const void *x, void *y, void *residuals) {
  const flatmem_reversible_context context = make_context(site, chain);
  const DLTensor xt = s.tensor(x);
  DLTensor yt = s.tensor(y);
  callback_message.clear();
  check_callback(fn.forward(fn.user, &context, &xt, &yt, residuals), site, "forward");
}

void call_vjp(const flatmem_reversible_function &fn, const CallSite &site, Chain *chain,
              const StateLayout &s, const void *x, const void *residuals, const void *dy,
              void *dx) {
  const flatmem_reversible_context context = make_context(site, chain);
  const DLTensor xt = s.tensor(x), dyt = s.tensor(dy);
  DLTensor dxt = s.tensor(dx);
  callback_message.clear();
  check_callback(fn.vjp(fn.user, &context, &xt, residuals, &dyt, &dxt), site, "vjp");
}

std::size_t call_residual_size(const flatmem_reversible_function &fn, std::int32_t block,
                               flatmem_reversible_part part, const StateLayout &s) {
  if (fn.residual_size == nullptr) return 0;
  CallSite site;
  site.block = block;
  site.part = part;
  site.phase = FLATMEM_REVERSIBLE_PHASE_REBUILD;
  const flatmem_reversible_context context = make_context(site, nullptr);
  const DLTensor xt = s.tensor(nullptr);
  std::size_t bytes = 0;
  callback_message.clear();
  check_callback(fn.residual_size(fn.user, &context, &xt, &bytes), site, "residual_size");
  if (bytes > (std::size_t(1) << 62))
    invalid("block ", block, ", ", part_name(part), " residual_size: ", bytes,
            " bytes is beyond any memory");
  return bytes;
}

}  // namespace flatmem::reversible
