// Host-side writers of a device's parameters, checked on the CPU: groups made in a stand-in
// "device" space (host pages behind a MemorySpace that is not host_memory(), so the code takes its
// device path and the backend's copies -- the CPU's memcpy here -- move the values) must end up
// with exactly what the same writer gives groups in host memory; and files written from such groups
// -- a checkpoint save, the HF export -- must be byte-equal to those written from the host's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "titan/core/allocator.h"
#include "titan/models/hf_export.h"
#include "titan/models/qwen3/flavors.h"
#include "titan/models/state_dict_adapter.h"
#include "titan/nn/host_params.h"
#include "titan/nn/param_group.h"
#include "titan/train/checkpoint.h"
#include "unit/test_safetensors_util.h"

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

// The tiny Qwen3's groups in `space`, drawn from fixed seeds, the moments filled in order.
std::vector<ParamGroup> tiny_groups(const std::vector<ParamGroupSpec>& specs, MemorySpace& space) {
  std::vector<ParamGroup> groups;
  for (const ParamGroupSpec& spec : specs) {
    groups.emplace_back(spec.name, spec.params, Residency::committed, &space);
    groups.back().allocate_optimizer_state();
  }
  write_params_on_host(groups, /*with_optimizer_state=*/true, [](std::vector<ParamGroup>& host) {
    float next = 0.5f;
    for (ParamGroup& g : host) {
      g.initialize(11 + static_cast<uint64_t>(&g - host.data()), 0.02f);
      for (const ParamView& v : g.views()) {
        for (int64_t i = 0; i < v.numel; ++i) {
          g.exp_avg()[v.offset + i] = next * 1e-3f;
          g.exp_avg_sq()[v.offset + i] = next * 1e-6f;
          next += 0.25f;
        }
      }
    }
  });
  return groups;
}

std::vector<std::string> files_of(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

void expect_same_files(const std::string& a, const std::string& b) {
  const std::vector<std::string> names = files_of(a);
  ASSERT_EQ(names, files_of(b));
  for (const std::string& name : names) {
    EXPECT_EQ(test::read_bytes(a + "/" + name), test::read_bytes(b + "/" + name)) << name;
  }
}

// A synchronous save and the HF export of a device's groups read them through the backend's
// copies (nn/host_params.h) and write the host's bytes.
TEST(HostParams, ASaveAndTheExportOfADevicesGroupsAreTheHostsFiles) {
  const ModelArgs& args = flavor("tiny");
  const std::vector<ParamGroupSpec> specs = model_param_specs(args);
  StandInDevice device;
  std::vector<ParamGroup> host = tiny_groups(specs, host_memory());
  std::vector<ParamGroup> on_device = tiny_groups(specs, device);
  for (size_t g = 0; g < host.size(); ++g) {
    ASSERT_TRUE(same_bits(host[g], on_device[g])) << g;
    ASSERT_TRUE(same_moments(host[g], on_device[g])) << g;
  }
  EXPECT_FALSE(in_device_memory(host));
  EXPECT_TRUE(in_device_memory(on_device));
  EXPECT_TRUE(checkpoint_groups(on_device)[0].in_device_memory);
  EXPECT_FALSE(checkpoint_groups(host)[0].in_device_memory);

  test::ScratchDir dir;
  for (const bool model_only : {false, true}) {
    const std::string tag = model_only ? "model-only" : "full";
    for (const auto* groups : {&host, &on_device}) {
      const std::string out = dir / (tag + (groups == &host ? "-host" : "-device"));
      std::filesystem::create_directories(out);
      write_checkpoint_shard(out, specs, checkpoint_groups(*groups), Shard{}, model_only,
                             /*show_progress=*/false);
    }
    expect_same_files(dir / (tag + "-host"), dir / (tag + "-device"));
  }
  for (const DType dtype : {DType::f32, DType::bf16}) {
    HfExportOptions options;
    options.dtype = dtype;
    const std::string tag(dtype_name(dtype));
    export_hf_folder(dir / ("hf-host-" + tag), args, host, options);
    export_hf_folder(dir / ("hf-device-" + tag), args, on_device, options);
    expect_same_files(dir / ("hf-host-" + tag), dir / ("hf-device-" + tag));
  }
}

TEST(HostParams, GroupsPartlyOnADeviceAreRefused) {
  StandInDevice device;
  std::vector<ParamGroup> mixed;
  mixed.emplace_back("g0", kSpecs, Residency::committed, &host_memory());
  mixed.emplace_back("g1", kSpecs, Residency::committed, &device);
  try {
    (void)in_device_memory(mixed);
    ADD_FAILURE() << "mixed groups accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "1 of 2 parameter groups are device memory and the others host memory");
  }
}

}  // namespace
}  // namespace titan
