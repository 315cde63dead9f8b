// libFuzzer target: the size rules of the ABI (flatmem.h, "Conventions") as a hostile
// caller meets them -- any size argument or struct_size, the caller's struct smaller than,
// equal to or larger than the library's, with any bytes past the library's sizeof -- over
// the init functions, the options and schedules the library reads, and the structs and
// arrays it writes (pure schedule queries and a cyclic handle over a group of one).
//
// Every struct lives in a block of 8 KiB + a guard, pre-filled with a fuzzed byte. Checks:
// a size of 0 or over FLATMEM_MAX_STRUCT_SIZE is INVALID_ARGUMENT and the block is untouched;
// otherwise a write covers exactly the caller's size (the guard and everything past the size
// keep the fill), bytes past the library's sizeof read 0, an init sets struct_size; a read
// struct with a set byte past the library's sizeof is UNSUPPORTED, with them all 0 it is read
// like the library's own size.
//
// Input layout: Plan, then raw bytes for sizes, tails and the fill.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <flatmem/flatmem.h>

#include "support/fuzz_input.hpp"

using namespace flatmem_fuzz;

namespace {

constexpr std::size_t block_bytes = 8192;
constexpr std::size_t guard = 64;

struct Plan {
  std::uint8_t function, size, tail, fill, count;
};

// A size a caller may pass: around the library's sizeof, at the limits, or raw.
std::size_t fuzzed_size(Reader &in, std::uint8_t choice, std::size_t known) {
  switch (choice % 10) {
    case 0: return known;
    case 1: return known + 1 + in.byte() % 64;                     // a newer caller
    case 2: return in.byte() % (known + 1);                         // an older one (0 included)
    case 3: return 0;
    case 4: return FLATMEM_MAX_STRUCT_SIZE;
    case 5: return FLATMEM_MAX_STRUCT_SIZE + 1;
    case 6: return std::size_t(-1);
    case 7: return std::size_t(1) << (32 + in.byte() % 31);
    default: return in.raw<std::uint16_t>();                       // 0 .. 65535
  }
}

class Block {
 public:
  explicit Block(std::uint8_t fill) : fill_(fill), bytes_(block_bytes + guard, fill) {}
  void *data() { return bytes_.data(); }
  unsigned char &operator[](std::size_t i) { return bytes_[i]; }
  // Every byte from `from` on still holds the fill.
  bool kept_from(std::size_t from) const {
    for (std::size_t i = from; i < bytes_.size(); ++i)
      if (bytes_[i] != fill_) return false;
    return true;
  }
  bool zero(std::size_t from, std::size_t to) const {
    for (std::size_t i = from; i < to; ++i)
      if (bytes_[i] != 0) return false;
    return true;
  }

 private:
  unsigned char fill_;
  std::vector<unsigned char> bytes_;
};

bool size_valid(std::size_t size, std::size_t minimum) { return size >= minimum && size <= FLATMEM_MAX_STRUCT_SIZE; }

// One write of a struct of the library's sizeof `known` at `size`.
void check_write(const char *call, flatmem_status status, const Block &b, std::size_t size, std::size_t known,
                 std::size_t minimum) {
  const bool ok = check_status(status, call);
  if (!size_valid(size, minimum)) {
    if (ok || status != FLATMEM_STATUS_INVALID_ARGUMENT)
      violation(call, "size " + std::to_string(size) + " accepted (status " + std::to_string(status) + ")");
    if (!b.kept_from(0)) violation(call, "refused but wrote the caller's block");
    return;
  }
  if (!ok) return;  // refused for another argument: checked by check_status (message set)
  if (!b.kept_from(size)) violation(call, "wrote past the caller's " + std::to_string(size) + " bytes");
  if (size > known && !b.zero(known, size)) violation(call, "bytes past the library's sizeof are not 0");
}

template <typename Struct>
void init(Reader &in, const Plan &p, flatmem_status (*fn)(Struct *, size_t), const char *call) {
  Block b(p.fill);
  const std::size_t size = fuzzed_size(in, p.size, sizeof(Struct));
  const bool null = p.tail == 255;
  const flatmem_status s = fn(null ? nullptr : static_cast<Struct *>(b.data()), size);
  if (null) {
    if (s != FLATMEM_STATUS_INVALID_ARGUMENT) violation(call, "NULL options accepted");
    return;
  }
  check_write(call, s, b, size, sizeof(Struct), sizeof(std::size_t));
  if (s == FLATMEM_STATUS_SUCCESS) {
    std::size_t struct_size = 0;
    std::memcpy(&struct_size, b.data(), sizeof struct_size);
    if (struct_size != size) violation(call, "struct_size " + std::to_string(struct_size) + " != " + std::to_string(size));
  }
}

// Reads: a struct initialised at the library's size, then given a fuzzed struct_size and
// fuzzed bytes past the library's sizeof (zero with tail choice 0). `read` calls the
// function that reads it; `fine` is what it returns for the library's own size.
template <typename Struct, typename Read>
void read(Reader &in, const Plan &p, Struct initial, Read read_fn, const char *call) {
  Block b(0);
  std::memcpy(b.data(), &initial, sizeof initial);
  const std::size_t size = fuzzed_size(in, p.size, sizeof(Struct));
  std::memcpy(b.data(), &size, sizeof size);
  bool unknown_set = false;
  if (p.tail % 2 == 1)
    for (std::size_t i = sizeof(Struct); i < block_bytes && i < sizeof(Struct) + 80; ++i) {
      b[i] = in.byte();
      if (i < size && b[i] != 0) unknown_set = true;
    }
  const flatmem_status s = read_fn(static_cast<const Struct *>(b.data()));
  check_status(s, call);
  if (!size_valid(size, sizeof(std::size_t))) {
    if (s != FLATMEM_STATUS_INVALID_ARGUMENT) violation(call, "struct_size " + std::to_string(size) + " accepted");
  } else if (unknown_set) {
    if (s != FLATMEM_STATUS_UNSUPPORTED) violation(call, "a set byte past the library's sizeof was not refused");
  } else if (size >= sizeof(Struct) && s != FLATMEM_STATUS_SUCCESS) {
    violation(call, "the library's own struct (zero tail) refused: " + std::string(flatmem_last_error()));
  }
}

flatmem_cyclic_schedule small_schedule() {
  flatmem_cyclic_schedule s = FLATMEM_CYCLIC_SCHEDULE_INIT;
  s.world_size = 3;
  s.stages = 2;
  s.steps = 3;
  return s;
}

flatmem_cyclic_stages_schedule small_stage_schedule() {
  flatmem_cyclic_stages_schedule s = FLATMEM_CYCLIC_STAGES_SCHEDULE_INIT;
  s.stages = 2;
  s.micro_batches = 3;
  s.steps = 2;
  return s;
}

// A cyclic handle over a group of one, made once: its read-only outputs.
struct Group {
  Group() {
    flatmem_comm_create_local(&comm, 1, nullptr);
    flatmem_cyclic_options o = FLATMEM_CYCLIC_OPTIONS_INIT;
    o.stages = 2;
    o.steps = 2;
    flatmem_cyclic_create(&cyclic, comm, &o);
    flatmem_cyclic_action a;
    flatmem_cyclic_next(cyclic, &a, sizeof a);  // one time step of statistics
  }
  flatmem_comm_t *comm = nullptr;
  flatmem_cyclic_t *cyclic = nullptr;
};

Group &group() {
  static Group g;
  return g;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t *data, std::size_t size) {
  Reader in(data, size);
  const Plan p = read_plan<Plan>(in);
  switch (p.function % 14) {
    case 0: init(in, p, flatmem_contrastive_options_init, "flatmem_contrastive_options_init"); break;
    case 1: init(in, p, flatmem_reversible_options_init, "flatmem_reversible_options_init"); break;
    case 2: init(in, p, flatmem_block_options_init, "flatmem_block_options_init"); break;
    case 3: init(in, p, flatmem_comm_options_init, "flatmem_comm_options_init"); break;
    case 4: init(in, p, flatmem_cyclic_options_init, "flatmem_cyclic_options_init"); break;
    case 5: init(in, p, flatmem_cyclic_stages_options_init, "flatmem_cyclic_stages_options_init"); break;
    case 6: {
      flatmem_contrastive_options o = FLATMEM_CONTRASTIVE_OPTIONS_INIT;
      o.num_threads = 1;
      read(in, p, o, [](const flatmem_contrastive_options *given) {
        flatmem_contrastive_t *h = nullptr;
        const flatmem_status s = flatmem_contrastive_create(&h, given);
        if (s != FLATMEM_STATUS_SUCCESS && h != nullptr) violation("flatmem_contrastive_create", "failed but set *out");
        if (h != nullptr) flatmem_contrastive_destroy(h);  // (a destroy would clear the failure's message)
        return s;
      }, "flatmem_contrastive_create");
      break;
    }
    case 7:
      read(in, p, small_schedule(), [](const flatmem_cyclic_schedule *given) {
        std::int64_t length = -1;
        return flatmem_cyclic_schedule_length(given, &length);
      }, "flatmem_cyclic_schedule_length");
      break;
    case 8:
      read(in, p, small_stage_schedule(), [](const flatmem_cyclic_stages_schedule *given) {
        std::int32_t kept = -1;
        return flatmem_cyclic_stages_schedule_versions_kept(given, 0, &kept);
      }, "flatmem_cyclic_stages_schedule_versions_kept");
      break;
    case 9: {
      Block b(p.fill);
      const flatmem_cyclic_schedule s = small_schedule();
      const std::size_t n = fuzzed_size(in, p.size, sizeof(flatmem_cyclic_action));
      check_write("flatmem_cyclic_schedule_action",
                  flatmem_cyclic_schedule_action(&s, 1, in.byte() % 24, static_cast<flatmem_cyclic_action *>(b.data()), n),
                  b, n, sizeof(flatmem_cyclic_action), 1);
      break;
    }
    case 10: {  // an array of structs: element size and capacity both fuzzed
      Block b(p.fill);
      const flatmem_cyclic_stages_schedule s = small_stage_schedule();
      const std::size_t element = fuzzed_size(in, p.size, sizeof(flatmem_cyclic_stages_action));
      const std::int32_t capacity = std::int32_t(p.count % 5);
      std::int32_t count = -1;
      const bool fits = element == 0 || element > block_bytes || std::size_t(capacity) * element <= block_bytes;
      if (!fits) break;
      const flatmem_status st = flatmem_cyclic_stages_schedule_actions(
          &s, std::int32_t(in.byte() % 2), in.byte() % 16, static_cast<flatmem_cyclic_stages_action *>(b.data()),
          element, capacity, &count);
      const bool ok = check_status(st, "flatmem_cyclic_stages_schedule_actions");
      if (!size_valid(element, 1)) {
        if (ok) violation("flatmem_cyclic_stages_schedule_actions", "element_size " + std::to_string(element) + " accepted");
        if (!b.kept_from(0)) violation("flatmem_cyclic_stages_schedule_actions", "refused but wrote the caller's block");
      } else if (ok) {
        const std::size_t used = std::size_t(std::min(count, capacity)) * element;
        if (!b.kept_from(used)) violation("flatmem_cyclic_stages_schedule_actions", "wrote past the actions it returned");
        for (std::int32_t i = 0; i < std::min(count, capacity); ++i)
          if (element > sizeof(flatmem_cyclic_stages_action) &&
              !b.zero(i * element + sizeof(flatmem_cyclic_stages_action), (i + 1) * element))
            violation("flatmem_cyclic_stages_schedule_actions", "bytes past the library's sizeof are not 0");
      }
      break;
    }
    case 11: {
      Block b(p.fill);
      const std::size_t n = fuzzed_size(in, p.size, sizeof(flatmem_cyclic_summary));
      check_write("flatmem_cyclic_summary_get",
                  flatmem_cyclic_summary_get(group().cyclic, static_cast<flatmem_cyclic_summary *>(b.data()), n), b, n,
                  sizeof(flatmem_cyclic_summary), 1);
      break;
    }
    case 12: {
      Block b(p.fill);
      const std::size_t element = fuzzed_size(in, p.size, sizeof(flatmem_cyclic_time_step_stats));
      const std::int64_t count = p.count % 4;
      if (size_valid(element, 1) && std::size_t(count) * element > block_bytes) break;
      std::int64_t written = -7;
      const flatmem_status st = flatmem_cyclic_stats(
          group().cyclic, 0, count, static_cast<flatmem_cyclic_time_step_stats *>(b.data()), element, &written);
      const bool ok = check_status(st, "flatmem_cyclic_stats");
      if (!size_valid(element, 1)) {
        if (ok) violation("flatmem_cyclic_stats", "element_size " + std::to_string(element) + " accepted");
        if (!b.kept_from(0) || written != -7) violation("flatmem_cyclic_stats", "refused but wrote");
      } else if (ok && !b.kept_from(std::size_t(written) * element)) {
        violation("flatmem_cyclic_stats", "wrote past the elements it returned");
      }
      break;
    }
    default: {
      Block b(p.fill);
      const std::size_t n = fuzzed_size(in, p.size, sizeof(flatmem_cyclic_schedule));
      flatmem_cyclic_schedule *out = static_cast<flatmem_cyclic_schedule *>(b.data());
      check_write("flatmem_cyclic_get_schedule", flatmem_cyclic_get_schedule(group().cyclic, out, n), b, n,
                  sizeof(flatmem_cyclic_schedule), sizeof(std::size_t));  // it begins with struct_size
      break;
    }
  }
  return 0;
}
