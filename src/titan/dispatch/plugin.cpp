#include "titan/dispatch/plugin.h"

#include <dlfcn.h>

#include <filesystem>
#include <map>
#include <mutex>

#include "titan/core/error.h"

namespace titan {
namespace {

class RegistryRegistrar final : public KernelPluginRegistrar {
 public:
  explicit RegistryRegistrar(const std::string& path) : path_(path) {}
  void add(KernelEntry entry) override {
    const std::string name = entry.name;
    try {
      kernel_registry().add(std::move(entry));
    } catch (const Error& e) {
      fail("kernel plugin '", path_, "': ", e.what());
    }
    names.push_back(name);
  }
  std::vector<std::string> names;

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
  registration(registrar);
  TITAN_CHECK(!registrar.names.empty(), "kernel plugin '", path, "' registered no kernel");
  return loaded[canonical] = registrar.names;
}

}  // namespace titan
