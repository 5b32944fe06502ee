#include "titan/dispatch/plugin.h"

#include <dlfcn.h>

#include <exception>
#include <filesystem>
#include <map>
#include <mutex>

#include "titan/core/error.h"

namespace titan {
namespace {

// Collects a plugin's kernels, each validated as it is added (against the registry and the
// plugin's earlier ones); load_kernel_plugin adds them to the registry only once the whole
// registration has returned, so a plugin refused anywhere registers none.
class RegistryRegistrar final : public KernelPluginRegistrar {
 public:
  explicit RegistryRegistrar(const std::string& path) : path_(path) {}
  void add(KernelEntry entry) override {
    try {
      kernel_registry().validate(entry);
      for (const KernelEntry& earlier : pending) {
        TITAN_CHECK(earlier.name != entry.name, "kernel '", entry.name, "' is registered twice");
      }
    } catch (const Error& e) {
      refusal = detail::concat("kernel plugin '", path_, "': ", e.what());
      throw Error(refusal);
    }
    pending.push_back(std::move(entry));
  }
  std::vector<KernelEntry> pending;
  // Set when add() refused a kernel: the one line naming the plugin and the kernel (also when the
  // plugin caught that error and went on).
  std::string refusal;

 private:
  const std::string& path_;
};

}  // namespace

std::vector<std::string> load_kernel_plugin(const std::string& path) {
  // Each file once per process, by its canonical path; kept loaded for good (its kernels are
  // function pointers into it).
  static std::mutex mutex;
  static std::map<std::string, std::vector<std::string>> loaded;
  const std::lock_guard<std::mutex> lock(mutex);
  std::error_code ec;
  const std::filesystem::path file(path);
  TITAN_CHECK(std::filesystem::exists(file, ec), "kernel plugin '", path, "': no such file");
  TITAN_CHECK(!std::filesystem::is_directory(file, ec), "kernel plugin '", path,
              "' is a directory, not a shared library");
  const std::string canonical = std::filesystem::canonical(file, ec).string();
  TITAN_CHECK(!ec, "kernel plugin '", path, "': ", ec.message());
  if (const auto it = loaded.find(canonical); it != loaded.end()) return it->second;

  // RTLD_NOW: a symbol the plugin needs and titan does not export fails here, not mid-run.
  void* handle = dlopen(canonical.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    fail("kernel plugin '", path, "': cannot load it: ", why != nullptr ? why : "unknown error");
  }
  const auto refuse = [&](const auto&... what) {
    dlclose(handle);
    fail("kernel plugin '", path, what...);
  };
  const auto abi = reinterpret_cast<uint64_t (*)()>(dlsym(handle, "titan_kernel_plugin_abi"));
  const auto registration =
      reinterpret_cast<void (*)(KernelPluginRegistrar&)>(dlsym(handle, "titan_register_kernels"));
  if (abi == nullptr || registration == nullptr) {
    refuse("' is not a titan kernel plugin: it exports no ",
           abi == nullptr ? "titan_kernel_plugin_abi" : "titan_register_kernels",
           " (define its registration with TITAN_KERNEL_PLUGIN, titan/dispatch/plugin.h)");
  }
  if (abi() != kernel_plugin_abi()) {
    refuse("' was built against another titan's kernel interface (", abi(), ", this titan's ",
           kernel_plugin_abi(), "): rebuild it against this titan's headers");
  }
  RegistryRegistrar registrar(path);
  // The plugin stays loaded after a refusal (dlclose could unload code a static destructor of it
  // still needs); none of its kernels is registered.
  const auto after = [&] {
    return registrar.pending.empty()
               ? std::string(" before adding any kernel")
               : " after adding kernel '" + registrar.pending.back().name + "'";
  };
  try {
    registration(registrar);
  } catch (const Error& e) {
    if (!registrar.refusal.empty()) throw Error(registrar.refusal);
    fail("kernel plugin '", path, "': its registration threw", after(), ": ", e.what());
  } catch (const std::exception& e) {
    fail("kernel plugin '", path, "': its registration threw", after(), ": ", e.what());
  } catch (...) {
    fail("kernel plugin '", path, "': its registration threw", after(),
         " something that is not a std::exception");
  }
  if (!registrar.refusal.empty()) throw Error(registrar.refusal);
  TITAN_CHECK(!registrar.pending.empty(), "kernel plugin '", path, "' registered no kernel");
  std::vector<std::string> names;
  for (KernelEntry& entry : registrar.pending) {
    names.push_back(entry.name);
    kernel_registry().add(std::move(entry));
  }
  return loaded[canonical] = names;
}

}  // namespace titan
