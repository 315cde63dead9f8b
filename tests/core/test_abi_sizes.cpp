// The size rules of the C ABI (flatmem.h, "Conventions") swept over every
// size a caller can pass: the init functions and a pure output function
// write exactly the caller's size (their fields, then zeros) and never past
// it; sizes of 0 or over FLATMEM_MAX_STRUCT_SIZE are refused naming the
// argument with the caller's bytes untouched; an options struct is read up to
// min(struct_size, sizeof) and one with a set byte past the library's sizeof
// is refused (UNSUPPORTED). tests/abi/abi_caller.c runs the same rules as a
// program built against the frozen headers.
#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr std::size_t guard = 64;
constexpr unsigned char fill = 0xA5;

bool error_has(const char *text) { return std::string(flatmem_last_error()).find(text) != std::string::npos; }

// A caller's block of `size` bytes plus a guard, all `fill`.
struct Block {
  explicit Block(std::size_t size) : size(size), bytes(size + guard, fill) {}
  void *data() { return bytes.data(); }
  bool untouched() const {
    for (unsigned char b : bytes)
      if (b != fill) return false;
    return true;
  }
  bool guard_intact() const {
    for (std::size_t i = size; i < bytes.size(); ++i)
      if (bytes[i] != fill) return false;
    return true;
  }
  // Bytes from `known` to the caller's size are zero.
  bool zero_from(std::size_t known) const {
    for (std::size_t i = known; i < size; ++i)
      if (bytes[i] != 0) return false;
    return true;
  }
  std::size_t size;
  std::vector<unsigned char> bytes;
};

// Every size a caller could be compiled with, around the library's sizeof.
std::vector<std::size_t> sizes_around(std::size_t known) {
  std::vector<std::size_t> s;
  for (std::size_t n = 1; n <= known + 24; ++n) s.push_back(n);
  for (std::size_t n : {known + 64, std::size_t(1000), std::size_t(FLATMEM_MAX_STRUCT_SIZE)}) s.push_back(n);
  return s;
}

template <typename Struct>
void sweep_init(flatmem_status (*init)(Struct *, size_t), flatmem_status (*create_with)(const Struct *)) {
  for (std::size_t size : sizes_around(sizeof(Struct))) {
    CAPTURE(size);
    Block b(size);
    const flatmem_status s = init(static_cast<Struct *>(b.data()), size);
    if (size < sizeof(std::size_t)) {
      CHECK(s == FLATMEM_STATUS_INVALID_ARGUMENT);
      CHECK(error_has("struct_size"));
      CHECK(b.untouched());
      continue;
    }
    REQUIRE(s == FLATMEM_STATUS_SUCCESS);
    CHECK(b.guard_intact());
    CHECK(b.zero_from(sizeof(Struct)));
    std::size_t struct_size = 0;
    std::memcpy(&struct_size, b.data(), sizeof struct_size);
    CHECK(struct_size == size);
    // What the init wrote is a valid options struct of that size: defaults
    // for every field it does not hold.
    if (create_with != nullptr) CHECK_MESSAGE(create_with(static_cast<Struct *>(b.data())) == FLATMEM_STATUS_SUCCESS,
                                              flatmem_last_error());
  }
  for (std::size_t size : {std::size_t(0), std::size_t(FLATMEM_MAX_STRUCT_SIZE + 1), std::size_t(-1)}) {
    CAPTURE(size);
    Block b(64);
    CHECK(init(static_cast<Struct *>(b.data()), size) == FLATMEM_STATUS_INVALID_ARGUMENT);
    CHECK(error_has("struct_size"));
    CHECK(b.untouched());
  }
  CHECK(init(nullptr, sizeof(Struct)) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("options"));
}

// Reading: a struct of the library's size plus `extra` bytes, each set in
// turn, is refused naming the byte; all zero, it is accepted.
template <typename Struct>
void sweep_unknown_fields(flatmem_status (*init)(Struct *, size_t), flatmem_status (*create_with)(const Struct *)) {
  constexpr std::size_t extra = 24;
  Block b(sizeof(Struct) + extra);
  REQUIRE(init(static_cast<Struct *>(b.data()), b.size) == FLATMEM_STATUS_SUCCESS);
  CHECK(create_with(static_cast<Struct *>(b.data())) == FLATMEM_STATUS_SUCCESS);
  for (std::size_t i = sizeof(Struct); i < b.size; ++i) {
    CAPTURE(i);
    b.bytes[i] = 0x01;
    CHECK(create_with(static_cast<Struct *>(b.data())) == FLATMEM_STATUS_UNSUPPORTED);
    CHECK(error_has(("byte " + std::to_string(i)).c_str()));
    CHECK(error_has("newer flatmem.h"));
    b.bytes[i] = 0;
  }
  // A struct_size past FLATMEM_MAX_STRUCT_SIZE is uninitialised memory, not a struct.
  const std::size_t huge = FLATMEM_MAX_STRUCT_SIZE + 1;
  std::memcpy(b.data(), &huge, sizeof huge);
  CHECK(create_with(static_cast<Struct *>(b.data())) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("struct_size"));
}

flatmem_status create_contrastive(const flatmem_contrastive_options *o) {
  flatmem_contrastive_t *h = nullptr;
  const flatmem_status s = flatmem_contrastive_create(&h, o);
  if (h != nullptr) flatmem_contrastive_destroy(h);  // (a destroy would clear the failure's message)
  return s;
}

flatmem_status create_comm(const flatmem_comm_options *o) {
  flatmem_comm_t *c = nullptr;
  const flatmem_status s = flatmem_comm_create_local(&c, 1, o);
  if (s == FLATMEM_STATUS_SUCCESS) flatmem_comm_destroy(c);
  return s;
}

flatmem_status create_block(const flatmem_block_options *given) {
  // kind and width are required: set them in a copy of the caller's bytes
  // (a struct_size the library refuses unread is passed on as it is).
  flatmem_block_t *b = nullptr;
  flatmem_status s;
  if (given->struct_size < sizeof(flatmem_block_options) || given->struct_size > FLATMEM_MAX_STRUCT_SIZE) {
    s = flatmem_block_create(&b, given);
  } else {
    const auto *p = reinterpret_cast<const unsigned char *>(given);
    std::vector<unsigned char> copy(p, p + given->struct_size);
    auto *o = reinterpret_cast<flatmem_block_options *>(copy.data());
    o->kind = FLATMEM_BLOCK_MLP;
    o->width = 4;
    s = flatmem_block_create(&b, o);
  }
  if (b != nullptr) flatmem_block_destroy(b);
  return s;
}

}  // namespace

TEST_CASE("abi/sizes/contrastive options: init at every size, read up to it") {
  sweep_init(flatmem_contrastive_options_init, create_contrastive);
  sweep_unknown_fields(flatmem_contrastive_options_init, create_contrastive);
}

TEST_CASE("abi/sizes/comm options: init at every size, read up to it") {
  sweep_init(flatmem_comm_options_init, create_comm);
  sweep_unknown_fields(flatmem_comm_options_init, create_comm);
}

TEST_CASE("abi/sizes/block options: init at every size, unknown fields refused") {
  // Sizes that do not hold kind and width are refused by create (required
  // fields), so only the writes are swept here.
  sweep_init<flatmem_block_options>(flatmem_block_options_init, nullptr);
  sweep_unknown_fields(flatmem_block_options_init, create_block);
}

TEST_CASE("abi/sizes/the other inits write exactly the caller's size") {
  sweep_init<flatmem_reversible_options>(flatmem_reversible_options_init, nullptr);
  sweep_init<flatmem_cyclic_options>(flatmem_cyclic_options_init, nullptr);
  sweep_init<flatmem_cyclic_stages_options>(flatmem_cyclic_stages_options_init, nullptr);
}

TEST_CASE("abi/sizes/an output struct: exactly the caller's size, a prefix of the full one") {
  flatmem_cyclic_schedule s = FLATMEM_CYCLIC_SCHEDULE_INIT;
  s.world_size = 3;
  s.stages = 2;
  s.steps = 4;
  flatmem_cyclic_action full{};
  REQUIRE(flatmem_cyclic_schedule_action(&s, 1, 5, &full, sizeof full) == FLATMEM_STATUS_SUCCESS);
  for (std::size_t size : sizes_around(sizeof full)) {
    CAPTURE(size);
    Block b(size);
    REQUIRE(flatmem_cyclic_schedule_action(&s, 1, 5, static_cast<flatmem_cyclic_action *>(b.data()), size) ==
            FLATMEM_STATUS_SUCCESS);
    CHECK(b.guard_intact());
    CHECK(b.zero_from(sizeof full));
    // The fields the caller's size holds whole are the full call's.
    flatmem_cyclic_action got{};
    std::memcpy(&got, b.data(), std::min(size, sizeof got));
    if (size >= offsetof(flatmem_cyclic_action, kind) + 4) {
      CHECK(got.time_step == full.time_step);
      CHECK(got.kind == full.kind);
    }
    if (size >= offsetof(flatmem_cyclic_action, step) + 8) CHECK(got.step == full.step);
    if (size >= sizeof got) {
      CHECK(got.stage == full.stage);
      CHECK(got.update_stage == full.update_stage);
      CHECK(got.update_step == full.update_step);
      CHECK(got.activations_held == full.activations_held);
      CHECK(got.phase == full.phase);
    }
  }
  for (std::size_t size : {std::size_t(0), std::size_t(FLATMEM_MAX_STRUCT_SIZE + 1)}) {
    CAPTURE(size);
    Block b(64);
    CHECK(flatmem_cyclic_schedule_action(&s, 1, 5, static_cast<flatmem_cyclic_action *>(b.data()), size) ==
          FLATMEM_STATUS_INVALID_ARGUMENT);
    CHECK(error_has("action_size"));
    CHECK(b.untouched());
  }
  // A schedule (read) with an unknown field set is refused, zero accepted.
  struct Newer {
    flatmem_cyclic_schedule known;
    std::int64_t appended;
  } newer{};
  newer.known = s;
  newer.known.struct_size = sizeof newer;
  std::int64_t length = 0;
  CHECK(flatmem_cyclic_schedule_length(&newer.known, &length) == FLATMEM_STATUS_SUCCESS);
  newer.appended = 7;
  CHECK(flatmem_cyclic_schedule_length(&newer.known, &length) == FLATMEM_STATUS_UNSUPPORTED);
  CHECK(error_has("schedule"));
}
