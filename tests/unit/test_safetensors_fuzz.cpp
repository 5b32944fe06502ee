// Bounded mutation fuzzing of the safetensors header parser (the one SafetensorsFile uses):
// whatever the bytes, it returns a header whose entries tile the data buffer, or throws
// titan::Error -- never crashes, reads out of bounds or throws anything else (the suite also
// runs under ASan/UBSan). Deterministic seed, a few seconds of work (TITAN_FUZZ_SECONDS for more,
// test_fuzz_util.h).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "test_fuzz_util.h"
#include "titan/io/safetensors_header.h"
#include "titan/io/safetensors_writer.h"
#include "unit/test_safetensors_util.h"

namespace titan {
namespace {

using Bytes = std::vector<unsigned char>;

// Tokens that steer mutations into the parser's interesting paths.
const std::vector<std::string> kDictionary = {"{",
                                              "}",
                                              "[",
                                              "]",
                                              ",",
                                              ":",
                                              "\"",
                                              "0",
                                              "1",
                                              "-1",
                                              "1.5",
                                              "1e999",
                                              "null",
                                              "true",
                                              "18446744073709551615",
                                              "18446744073709551616",
                                              "9223372036854775808",
                                              "4294967296",
                                              "\"dtype\"",
                                              "\"shape\"",
                                              "\"data_offsets\"",
                                              "\"__metadata__\"",
                                              "\"F32\"",
                                              "\"BF16\"",
                                              "\"F16\"",
                                              "\"I64\"",
                                              "\"BOOL\"",
                                              "\"F4\"",
                                              "\"\\u0000\"",
                                              "\"\\ud800\"",
                                              "\xff",
                                              " "};

uint64_t length_field(const Bytes& b) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | b[i];
  return n;
}

void set_length_field(Bytes& b, uint64_t n) {
  for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(n >> (8 * i));
}

// The header's byte range [8, 8 + N) clipped to the buffer.
size_t header_end(const Bytes& b) {
  if (b.size() < 8) return b.size();
  return static_cast<size_t>(std::min<uint64_t>(length_field(b), b.size() - 8)) + 8;
}

class Mutator {
 public:
  explicit Mutator(uint32_t seed) : rng_(seed) {}

  size_t pick(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }

  // A random header built from the schema's parts, with random data behind it.
  Bytes random_document() {
    std::string h = "{";
    const size_t n = pick(5);
    uint64_t offset = 0;
    for (size_t i = 0; i < n; ++i) {
      if (i > 0) h += ",";
      if (pick(6) == 0) {
        h += "\"__metadata__\":{\"format\":\"pt\"}";
        continue;
      }
      const char* dtypes[] = {"F32", "BF16", "F16", "I32", "I64", "U8", "F64", "XX"};
      const size_t sizes[] = {4, 2, 2, 4, 8, 1, 8, 1};
      const size_t d = pick(8);
      std::string shape = "[";
      uint64_t numel = 1;
      const size_t rank = pick(4);
      for (size_t r = 0; r < rank; ++r) {
        const uint64_t dim = pick(5);
        numel *= dim;
        shape += (r ? "," : "") + std::to_string(dim);
      }
      shape += "]";
      uint64_t bytes = numel * sizes[d];
      if (pick(8) == 0) bytes += pick(3);  // size mismatch
      uint64_t begin = pick(8) == 0 ? pick(16) : offset;
      h += "\"t" + std::to_string(pick(4)) + "\":{\"dtype\":\"" + dtypes[d] +
           "\",\"shape\":" + shape + ",\"data_offsets\":[" + std::to_string(begin) + "," +
           std::to_string(begin + bytes) + "]}";
      offset = begin + bytes;
    }
    h += "}";
    if (pick(2) == 0) h.append((8 - h.size() % 8) % 8, ' ');
    Bytes b(8);
    set_length_field(b, h.size());
    b.insert(b.end(), h.begin(), h.end());
    const size_t data = static_cast<size_t>(offset) + (pick(4) == 0 ? pick(5) : 0);
    b.resize(b.size() + (pick(4) == 0 && data > 0 ? data - 1 : data), 0x3f);
    return b;
  }

  void mutate(Bytes& b) {
    switch (pick(9)) {
      case 0:  // flip a bit, most often in the header
        if (!b.empty()) {
          const size_t at = pick(3) > 0 ? pick(header_end(b)) : pick(b.size());
          b[at] ^= static_cast<unsigned char>(1u << pick(8));
        }
        break;
      case 1:  // truncate
        b.resize(pick(b.size() + 1));
        break;
      case 2:  // a random or nearby length field
        if (b.size() >= 8) {
          const uint64_t n = length_field(b);
          const uint64_t choices[] = {rng_(),       n + pick(16), n - pick(16),
                                      b.size() - 8, 100'000'001,  ~uint64_t{0}};
          set_length_field(b, choices[pick(6)]);
        }
        break;
      case 3:  // overwrite a header byte with a token's first byte
        if (header_end(b) > 8)
          b[8 + pick(header_end(b) - 8)] = kDictionary[pick(kDictionary.size())][0];
        break;
      case 4:  // insert a token into the header, keeping the length field consistent
      case 5:  // delete a range of the header, keeping the length field consistent
      case 6:  // replace a run of digits with a token
        edit_header(b);
        break;
      case 7:  // grow or shrink the data
        if (pick(2) == 0) {
          b.resize(b.size() + pick(9), 0);
        } else if (!b.empty()) {
          b.erase(b.end() - static_cast<std::ptrdiff_t>(pick(std::min<size_t>(b.size(), 9))),
                  b.end());
        }
        break;
      default:
        b = random_document();
    }
  }

 private:
  void edit_header(Bytes& b) {
    if (b.size() < 8 || length_field(b) > b.size() - 8) return;
    const size_t n = static_cast<size_t>(length_field(b));
    std::string h(b.begin() + 8, b.begin() + 8 + static_cast<std::ptrdiff_t>(n));
    const Bytes data(b.begin() + 8 + static_cast<std::ptrdiff_t>(n), b.end());
    const std::string& token = kDictionary[pick(kDictionary.size())];
    const size_t at = pick(h.size() + 1);
    const size_t kind = pick(3);
    if (kind == 0) {
      h.insert(at, token);
    } else if (kind == 1 && !h.empty()) {
      h.erase(at, pick(8) + 1);
    } else {
      const size_t digit = h.find_first_of("0123456789", at);
      if (digit != std::string::npos) {
        const size_t end = h.find_first_not_of("0123456789", digit);
        h.replace(digit, (end == std::string::npos ? h.size() : end) - digit, token);
      }
    }
    b = test::raw_safetensors(h, data);
  }

  std::mt19937_64 rng_;
};

Bytes file_bytes(const std::string& path) {
  return test::read_bytes(path);
}

std::vector<Bytes> seeds() {
  test::ScratchDir dir;
  std::vector<Bytes> out;
  Tensor a = Tensor::zeros({3, 5}, DType::f32, MemCategory::other);
  Tensor b = Tensor::zeros({4}, DType::i64, MemCategory::other);
  Tensor s = Tensor::zeros({}, DType::f32, MemCategory::other);
  Tensor e = Tensor::zeros({0, 3}, DType::f32, MemCategory::other);
  SafetensorsWriteOptions bf16;
  bf16.float_dtype = DType::bf16;
  write_safetensors_file(dir / "1.safetensors", {{"w", a}, {"ids", b}}, {});
  write_safetensors_file(dir / "2.safetensors", {{"x", a}, {"s", s}, {"e", e}}, bf16);
  SafetensorsWriteOptions none;
  none.metadata.clear();
  write_safetensors_file(dir / "3.safetensors", {{"attn.0", a}}, none);
  for (const char* f : {"1.safetensors", "2.safetensors", "3.safetensors"}) {
    out.push_back(file_bytes(dir / f));
  }
  return out;
}

// The accepted header must describe the buffer exactly.
void check_invariants(const SafetensorsHeader& h, size_t size) {
  ASSERT_LE(h.data_start, size);
  size_t end = 0;
  for (const SafetensorsEntry& e : h.entries) {
    ASSERT_EQ(e.begin, end) << e.name;
    ASSERT_EQ(e.nbytes,
              static_cast<size_t>(e.numel()) * find_safetensors_dtype(e.dtype_name)->size);
    end = e.begin + e.nbytes;
  }
  ASSERT_EQ(h.data_start + end, size);
}

TEST(SafetensorsFuzz, HeaderParserNeverCrashes) {
  const std::vector<Bytes> corpus = seeds();
  const test::FuzzBudget budget = test::fuzz_budget();
  Mutator m(budget.seed);
  size_t accepted = 0;
  size_t refused = 0;
  const int64_t n = test::run_fuzz(budget, [&](int64_t) {
    Bytes input = corpus[m.pick(corpus.size())];
    const size_t rounds = 1 + m.pick(3);
    for (size_t r = 0; r < rounds; ++r) m.mutate(input);
    // Exactly sized copy: ASan flags any read past the end.
    std::unique_ptr<unsigned char[]> exact(
        new unsigned char[input.size() + (input.empty() ? 1 : 0)]);
    if (!input.empty()) std::memcpy(exact.get(), input.data(), input.size());
    try {
      const SafetensorsHeader h = parse_safetensors_header(exact.get(), input.size(), "fuzz");
      check_invariants(h, input.size());
      ++accepted;
    } catch (const Error& e) {
      ASSERT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
      ASSERT_EQ(std::string(e.what()).rfind("fuzz: ", 0), 0u) << e.what();
      ++refused;
    }
  });
  std::printf("fuzz: %lld inputs, %zu accepted, %zu refused\n", static_cast<long long>(n), accepted,
              refused);
  EXPECT_GT(accepted, 0u);
  EXPECT_GT(refused, 0u);
}

}  // namespace
}  // namespace titan
