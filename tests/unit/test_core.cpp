#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "titan/backend/cpu/threads.h"
#include "titan/core/allocator.h"
#include "titan/core/dtype.h"
#include "titan/core/error.h"
#include "titan/core/progress.h"
#include "titan/core/tensor.h"

namespace titan {
namespace {

TEST(Allocator, ChargesAndReleasesPerCategory) {
  const MemoryStats before = memory_stats();
  const int act = static_cast<int>(MemCategory::activations);
  {
    Tensor t = Tensor::zeros({3, 5}, DType::f32, MemCategory::activations);
    const MemoryStats during = memory_stats();
    EXPECT_EQ(during.current[act] - before.current[act], 60u);
    EXPECT_GE(during.peak[act], during.current[act]);
    EXPECT_EQ(t.data<float>()[14], 0.0f);
  }
  EXPECT_EQ(memory_stats().current[act], before.current[act]);
}

// FSDP's whole units: a decommitted buffer is not charged (nor counted twice when freed), keeps its
// address, and is usable again once recommitted -- for a huge-page buffer and a small one whose
// end pages stay.
TEST(Allocator, DecommitStopsChargingAndRecommitCharges) {
  const int grads = static_cast<int>(MemCategory::gradients);
  const size_t base = memory_stats().current[grads];
  for (const size_t bytes : {size_t{5} << 20, size_t{10000}}) {
    {
      Buffer b(host_memory(), bytes, MemCategory::gradients);
      float* data = b.as<float>();
      const size_t n = bytes / sizeof(float);
      std::fill(data, data + n, 3.0f);
      b.decommit();
      EXPECT_FALSE(b.committed());
      EXPECT_EQ(memory_stats().current[grads], base);
      b.decommit();  // twice is once
      EXPECT_EQ(memory_stats().current[grads], base);
      b.recommit();
      EXPECT_EQ(memory_stats().current[grads] - base, bytes);
      EXPECT_EQ(b.as<float>(), data);
      b.zero();
      EXPECT_EQ(data[n / 2], 0.0f);
      data[n - 1] = 1.0f;
      EXPECT_EQ(data[n - 1], 1.0f);
      b.decommit();
    }
    EXPECT_EQ(memory_stats().current[grads], base) << bytes << " bytes";
  }
}

// A buffer made released (FSDP's whole units at start-up) is never charged -- not even for a
// moment, so the peak does not see it -- until recommitted, and is freed without a charge.
TEST(Allocator, ReleasedBufferIsChargedOnlyOnceRecommitted) {
  const int params = static_cast<int>(MemCategory::parameters);
  memory_reset_peak();
  const size_t base = memory_stats().current[params];
  const size_t peak = memory_stats().peak[params];
  {
    Buffer b(host_memory(), size_t{8} << 20, MemCategory::parameters, Residency::released);
    EXPECT_FALSE(b.committed());
    EXPECT_NE(b.data(), nullptr);
    EXPECT_EQ(memory_stats().current[params], base);
    EXPECT_EQ(memory_stats().peak[params], peak);
    b.recommit();
    EXPECT_EQ(memory_stats().current[params] - base, size_t{8} << 20);
    b.zero();
    b.decommit();
  }
  {
    Buffer never_used(host_memory(), size_t{8} << 20, MemCategory::parameters, Residency::released);
  }
  EXPECT_EQ(memory_stats().current[params], base);
  EXPECT_EQ(memory_stats().peak[params], peak + (size_t{8} << 20));
}

// A Buffer's memory comes from the space it is made in (a backend's: Backend::memory()), which
// reserves and frees it, gets its pages back on decommit and zeroes it; the accounting is the
// Buffer's, the same in every space.
class RecordingSpace final : public MemorySpace {
 public:
  const char* name() const override { return "recording"; }
  void* reserve(size_t bytes, MemCategory category) override {
    calls.push_back("reserve " + std::to_string(bytes) + " " +
                    std::string(mem_category_name(category)));
    return host_memory().reserve(bytes, category);
  }
  void unreserve(void* ptr, size_t bytes) override {
    calls.push_back("unreserve " + std::to_string(bytes));
    host_memory().unreserve(ptr, bytes);
  }
  void release_pages(void* ptr, size_t bytes) override {
    calls.push_back("release_pages " + std::to_string(bytes));
    host_memory().release_pages(ptr, bytes);
  }
  void zero(void* ptr, size_t bytes) override {
    calls.push_back("zero " + std::to_string(bytes));
    host_memory().zero(ptr, bytes);
  }
  std::vector<std::string> calls;
};

TEST(Allocator, BufferUsesItsSpace) {
  const int grads = static_cast<int>(MemCategory::gradients);
  const size_t base = memory_stats().current[grads];
  RecordingSpace space;
  {
    Buffer b(space, 4096, MemCategory::gradients);
    EXPECT_EQ(b.space(), &space);
    EXPECT_EQ(memory_stats().current[grads] - base, 4096u);
    b.zero();
    b.decommit();
    EXPECT_EQ(memory_stats().current[grads], base);
    b.recommit();
    Buffer moved = std::move(b);
    EXPECT_EQ(moved.space(), &space);
  }
  EXPECT_EQ(memory_stats().current[grads], base);
  EXPECT_EQ(space.calls, (std::vector<std::string>{"reserve 4096 gradients", "zero 4096",
                                                   "release_pages 4096", "unreserve 4096"}));
}

TEST(Tensor, ReshapeAndNarrow) {
  Tensor t = Tensor::empty({4, 6}, DType::f32, MemCategory::other);
  for (int i = 0; i < 24; ++i) t.data<float>()[i] = static_cast<float>(i);
  Tensor rows = t.narrow0(1, 2);
  EXPECT_EQ(rows.shape(), (Shape{2, 6}));
  EXPECT_EQ(rows.data<float>()[0], 6.0f);
  EXPECT_EQ(t.reshape({2, 12}).size(1), 12);
  EXPECT_THROW(t.reshape({5, 5}), Error);
  EXPECT_THROW(t.narrow0(3, 2), Error);
  EXPECT_THROW(Tensor::empty({2, -1}, DType::f32, MemCategory::other), Error);
}

TEST(DType, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 is exactly halfway between two bf16 values; ties go to the even mantissa (1.0).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_EQ(f16_to_f32(f32_to_f16(0.333251953125f)), 0.333251953125f);
}

TEST(Threads, RejectsZero) {
  EXPECT_THROW(set_thread_count(0), Error);
}

}  // namespace
}  // namespace titan

// Progress writes into a memory stream; the drawing rules, not the clock, are under test, so
// show_after_s is 0 (or far in the future) and plain lines come at every advance.
class ProgressTest : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = titan::progress_output(); }
  void TearDown() override {
    titan::set_progress_output(saved_);
    if (stream_ != nullptr) std::fclose(stream_);
    std::free(buffer_);
  }
  void capture(bool terminal, double show_after_s) {
    stream_ = open_memstream(&buffer_, &size_);
    ASSERT_NE(stream_, nullptr);
    titan::set_progress_output({stream_, terminal, show_after_s, 0.0});
  }
  std::string written() {
    std::fflush(stream_);
    return std::string(buffer_, size_);
  }
  titan::ProgressOutput saved_;
  std::FILE* stream_ = nullptr;
  char* buffer_ = nullptr;
  size_t size_ = 0;
};

TEST_F(ProgressTest, TerminalRedrawsOneLineThenEndsIt) {
  capture(true, 0.0);
  {
    titan::Progress p("loading x", 4000, titan::ProgressUnit::bytes);
    p.advance(2000);
    const std::string line = written();
    EXPECT_EQ(line.rfind("\r\033[Kloading x [############............]  50%  2.00 kB / 4.00 kB", 0),
              0u)
        << line;
    EXPECT_EQ(line.find('\n'), std::string::npos) << "a terminal line is redrawn in place";
    p.advance(2000);
  }
  const std::string all = written();
  const size_t last = all.rfind("\r\033[K");
  ASSERT_NE(last, std::string::npos);
  EXPECT_EQ(all.substr(last + 4).rfind("loading x: 4.00 kB in ", 0), 0u) << all;
  EXPECT_EQ(all.back(), '\n');
}

TEST_F(ProgressTest, PlainOutputWritesWholeLines) {
  capture(false, 0.0);
  {
    titan::Progress p("tokenizing", 0, titan::ProgressUnit::tokens);
    p.advance(1500000);
    p.finish();
    p.finish();  // idempotent
  }
  const std::string all = written();
  EXPECT_EQ(all.find('\r'), std::string::npos) << all;
  EXPECT_EQ(all.rfind("tokenizing  1.50 M tokens  ", 0), 0u) << all;
  EXPECT_NE(all.find("\ntokenizing: 1.50 M tokens in "), std::string::npos) << all;
  EXPECT_EQ(std::count(all.begin(), all.end(), '\n'), 2) << all;
}

// An operation that throws does not claim it ended: no closing line, and a redrawn terminal line
// is ended so the error that follows prints on a line of its own.
TEST_F(ProgressTest, FailedOperationWritesNoClosingLine) {
  for (const bool terminal : {true, false}) {
    SCOPED_TRACE(terminal ? "terminal" : "plain");
    if (stream_ != nullptr) std::fclose(stream_);
    std::free(buffer_);
    buffer_ = nullptr;
    capture(terminal, 0.0);
    try {
      titan::Progress p("evaluating", 0, titan::ProgressUnit::batches);
      p.advance(2);
      throw std::runtime_error("row 3 is too long");
    } catch (const std::runtime_error&) {
    }
    const std::string all = written();
    EXPECT_EQ(
        all.rfind(terminal ? "\r\033[Kevaluating  2 batches  " : "evaluating  2 batches  ", 0), 0u)
        << all;
    EXPECT_EQ(all.find("evaluating:"), std::string::npos) << "no closing line: " << all;
    EXPECT_EQ(std::count(all.begin(), all.end(), '\n'), 1) << all;
    EXPECT_EQ(all.back(), '\n');
  }
}

TEST_F(ProgressTest, QuickOperationsStaySilent) {
  capture(true, 3600.0);
  {
    titan::Progress p("saving", 10, titan::ProgressUnit::items);
    p.advance(10);
  }
  EXPECT_EQ(written(), "");
}

TEST(ProgressFormat, Quantities) {
  EXPECT_EQ(titan::format_quantity(1.19e9, titan::ProgressUnit::bytes), "1.19 GB");
  EXPECT_EQ(titan::format_quantity(512, titan::ProgressUnit::bytes), "512 B");
  EXPECT_EQ(titan::format_quantity(310, titan::ProgressUnit::items), "310 items");
  EXPECT_EQ(titan::format_quantity(12345678, titan::ProgressUnit::tokens), "12.3 M tokens");
  EXPECT_EQ(titan::format_quantity(20, titan::ProgressUnit::batches), "20 batches");
  EXPECT_EQ(titan::format_quantity(1.357, titan::ProgressUnit::batches), "1.36 batches");
}
