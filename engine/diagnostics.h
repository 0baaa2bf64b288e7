// What `slipstream devices` and `slipstream doctor` print: this machine's CPU and CUDA devices,
// and a check of every link between the binary and the GPU, each failure with its fix.
#pragma once

#include <iosfwd>
#include <string>
#include <string_view>

namespace slipstream {

// Platform, CPU (model, threads, ISA), CUDA driver/runtime/library versions, each CUDA device,
// or "no CUDA device: <reason>", and the device `auto` would pick.
std::string devices_report();

// One line per check: "OK  ", "FAIL" (followed by an indented "fix: ..." line) or "SKIP".
// `device` is what the run would ask for ("auto", "cpu", "cuda", "cuda:N"). Returns 0 when that
// device is usable (for "auto": the CPU path at least), 1 when something it needs is broken.
int run_doctor(std::ostream& out, std::string_view device = "auto");

// Launches a tiny kernel on cuda:`index` and checks what it wrote. Returns "" on success, else
// what went wrong ("this build has no CUDA support ..." on CPU-only builds).
std::string cuda_probe_kernel(int index);

}  // namespace slipstream
