// Host-side writers of a device's parameters, checked on the CPU: groups made in a stand-in
// "device" space (host pages behind a MemorySpace that is not host_memory(), so the code takes its
// device path and the backend's copies -- the CPU's memcpy here -- move the values) must end up
// with exactly what the same writer gives groups in host memory.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "titan/core/allocator.h"
#include "titan/nn/host_params.h"
#include "titan/nn/param_group.h"

namespace titan {
namespace {

class StandInDevice final : public MemorySpace {
 public:
  const char* name() const override { return "stand-in device"; }
  void* reserve(size_t bytes, MemCategory category) override {
    return host_memory().reserve(bytes, category);
  }
  void unreserve(void* ptr, size_t bytes) override { host_memory().unreserve(ptr, bytes); }
  void release_pages(void* ptr, size_t bytes) override { host_memory().release_pages(ptr, bytes); }
  void zero(void* ptr, size_t bytes) override { host_memory().zero(ptr, bytes); }
};

// Views of odd sizes, so the 16-float padding between them is there to stay zero.
const std::vector<ParamSpec> kSpecs = {{"a.weight", {3, 5}, ParamInit::normal},
                                       {"a.norm", {7}, ParamInit::ones},
                                       {"b.weight", {4, 9}, ParamInit::kaiming_uniform},
                                       {"b.bias", {4}, ParamInit::zeros}};

bool same_bits(const ParamGroup& a, const ParamGroup& b) {
  return a.numel() == b.numel() &&
         std::memcmp(a.params(), b.params(), static_cast<size_t>(a.numel()) * sizeof(float)) == 0;
}

TEST(HostParams, InitialisationOnADeviceIsTheHostsBitForBit) {
  StandInDevice device;
  ParamGroup host("g", kSpecs, Residency::committed, &host_memory());
  ParamGroup on_device("g", kSpecs, Residency::committed, &device);
  EXPECT_EQ(&on_device.space(), &device);
  host.initialize(7, 0.02f);
  on_device.initialize(7, 0.02f);
  EXPECT_TRUE(same_bits(host, on_device));
  EXPECT_EQ(on_device.params()[0], host.params()[0]);
  EXPECT_NE(on_device.params()[0], 0.0f);  // drawn, not left zero
}

// What a loader does: every parameter (and, with the moments, exp_avg and exp_avg_sq) written by
// name, the padding left alone.
void write_by_name(std::vector<ParamGroup>& groups, bool moments) {
  float next = 1.0f;
  for (ParamGroup& g : groups) {
    for (const ParamView& v : g.views()) {
      for (int64_t i = 0; i < v.numel; ++i) {
        g.params()[v.offset + i] = next++;
        if (!moments) continue;
        g.exp_avg()[v.offset + i] = -next;
        g.exp_avg_sq()[v.offset + i] = 2 * next;
      }
    }
  }
}

bool same_moments(const ParamGroup& a, const ParamGroup& b) {
  const auto bytes = static_cast<size_t>(a.numel()) * sizeof(float);
  return std::memcmp(a.exp_avg(), b.exp_avg(), bytes) == 0 &&
         std::memcmp(a.exp_avg_sq(), b.exp_avg_sq(), bytes) == 0;
}

TEST(HostParams, AWriterOfADevicesGroupsWritesHostCopiesCopiedIn) {
  for (const bool moments : {false, true}) {
    StandInDevice device;
    std::vector<ParamGroup> host_groups, device_groups;
    for (const char* name : {"g0", "g1"}) {
      host_groups.emplace_back(name, kSpecs, Residency::committed, &host_memory());
      device_groups.emplace_back(name, kSpecs, Residency::committed, &device);
      host_groups.back().allocate_optimizer_state();
      device_groups.back().allocate_optimizer_state();
    }
    const ParamGroup* seen = nullptr;
    write_params_on_host(host_groups, moments, [&](std::vector<ParamGroup>& groups) {
      seen = &groups[0];
      write_by_name(groups, moments);
    });
    EXPECT_EQ(seen, &host_groups[0]);  // host groups are written in place
    write_params_on_host(device_groups, moments, [&](std::vector<ParamGroup>& groups) {
      ASSERT_EQ(groups.size(), 2u);
      for (const ParamGroup& g : groups) EXPECT_EQ(&g.space(), &host_memory());
      EXPECT_EQ(groups[1].name(), "g1");
      EXPECT_EQ(groups[0].exp_avg() != nullptr, moments);
      write_by_name(groups, moments);
    });
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_TRUE(same_bits(host_groups[i], device_groups[i])) << i;
      // Without the moments the device's stay as they were (zero), as the host's do.
      EXPECT_TRUE(same_moments(host_groups[i], device_groups[i])) << i << " " << moments;
    }
  }
}

}  // namespace
}  // namespace titan
