// titan verify-kernels: every registered kernel (or those named, after loading any plugins)
// against its op's fp32 reference, one line per output compared; exit status 1 when any is out of
// tolerance.
#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "titan/backend/cpu/threads.h"
#include "titan/core/error.h"
#include "titan/core/suggest.h"
#include "titan/dispatch/plugin.h"
#include "titan/dispatch/verify.h"

namespace titan::cli {

Action add_verify_kernels_command(CLI::App& app) {
  CLI::App* command = app.add_subcommand(
      "verify-kernels",
      "check every registered kernel's forward, backward and bf16 forms against the fp32 "
      "reference of its op on small random inputs");
  static int threads;
  static std::vector<std::string> names, plugins;
  add_threads_option(*command, threads);
  command->add_option("--kernel", names, "only this kernel (repeatable)");
  command->add_option("--plugin", plugins,
                      "load this kernel plugin first, as experimental.custom_import does for "
                      "titan train (repeatable)");
  return [] {
    set_thread_count(threads);
    for (const std::string& plugin : plugins) {
      std::printf("kernel plugin %s: %s\n", plugin.c_str(),
                  join_names(load_kernel_plugin(plugin)).c_str());
    }
    std::vector<const KernelEntry*> entries;
    if (names.empty()) {
      // A device's kernels take its memory: a CUDA build's are checked by titan_cuda_kernels_test.
      for (const KernelEntry* e : kernel_registry().entries()) {
        if (e->device == DeviceKind::cpu) entries.push_back(e);
      }
    } else {
      std::vector<std::string> known;
      for (const KernelEntry* e : kernel_registry().entries()) known.push_back(e->name);
      for (const std::string& name : names) {
        const KernelEntry* entry = kernel_registry().find(name);
        TITAN_CHECK(entry != nullptr, "no kernel named '", name, "' (did you mean '",
                    closest_name(name, known), "'?)");
        entries.push_back(entry);
      }
    }
    std::printf("%-25s %-15s %-26s %-26s %10s %10s\n", "kernel", "kind", "form", "output", "error",
                "tolerance");
    std::vector<std::string> failures;
    size_t n_checks = 0;
    for (const KernelEntry* entry : entries) {
      const KernelReport report = verify_kernel(*entry);
      for (const KernelCheck& c : report.checks) {
        ++n_checks;
        std::printf("%-25s %-15s %-26s %-26s %10.2e %10.2e  %s\n", report.kernel.c_str(),
                    op_kind_name(report.kind), c.form.c_str(), c.output.c_str(), c.error,
                    c.tolerance, c.passed() ? "ok" : "FAIL");
        if (!c.passed()) {
          char line[256];
          std::snprintf(line, sizeof line, "%s %s %s: error %.3g > tolerance %.3g",
                        report.kernel.c_str(), c.form.c_str(), c.output.c_str(), c.error,
                        c.tolerance);
          failures.emplace_back(line);
        }
      }
    }
    std::fflush(stdout);
    TITAN_CHECK(failures.empty(), failures.size(), " of ", n_checks,
                " checks out of tolerance (first: ", failures.empty() ? "" : failures[0], ")");
    std::printf("verify-kernels: %zu kernel%s, %zu checks, all within tolerance\n", entries.size(),
                entries.size() == 1 ? "" : "s", n_checks);
    return 0;
  };
}

}  // namespace titan::cli
