#include "engine/diagnostics.h"

#include <dlfcn.h>
#include <link.h>
#include <sys/utsname.h>

#include <oneapi/tbb/version.h>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>
#include <vector>

#include "engine/device.h"
#include "engine/memory_pool.h"

#if SLIPSTREAM_HAS_CUDA
#include "engine/cuda/cuda_backend.h"
#endif

namespace slipstream {

namespace {

std::string cuda_version_str(int v) {  // 13000 -> "13.0"
  if (v <= 0) return "none";
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

std::string platform_line() {
  std::string s;
  utsname u{};
  if (::uname(&u) == 0) s = std::string(u.sysname) + " " + u.release + " " + u.machine;
  std::ifstream os("/etc/os-release");
  std::string line;
  while (std::getline(os, line)) {
    if (line.starts_with("PRETTY_NAME=")) {
      std::string name = line.substr(12);
      if (name.size() >= 2 && name.front() == '"') name = name.substr(1, name.size() - 2);
      s += " (" + name + ")";
      break;
    }
  }
  return s.empty() ? "unknown" : s;
}

std::string isa_line(const CpuInfo& c) {
  auto yn = [](bool b) { return b ? "yes" : "no"; };
  return std::string("AVX2 ") + yn(c.avx2) + ", AVX-512 " + yn(c.avx512f) + ", AVX-512 BF16 " +
         yn(c.avx512_bf16) + ", AMX " + yn(c.amx_bf16);
}

std::string build_line() {
  std::string s = std::string("slipstream ") + SLIPSTREAM_VERSION;
#if SLIPSTREAM_HAS_CUDA
  s +=
      ", CUDA build (toolkit " SLIPSTREAM_CUDA_TOOLKIT_VERSION ", archs " SLIPSTREAM_CUDA_ARCHS ")";
#else
  s += ", CPU-only build";
#endif
  return s;
}

std::string tbb_version() {
  return std::string("oneTBB ") + TBB_runtime_version() + " (built with " TBB_VERSION_STRING ")";
}

std::string device_line(const CudaDeviceInfo& d) {
  return "cuda:" + std::to_string(d.index) + "  " + d.name + "  sm_" + std::to_string(d.cc_major) +
         std::to_string(d.cc_minor) + "  " + format_bytes(d.total_memory) + "  " +
         std::to_string(d.multiprocessors) + " SMs";
}

// Shared objects loaded into this process, by path.
[[maybe_unused]] std::vector<std::string> loaded_libraries() {
  std::vector<std::string> out;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        if (info->dlpi_name && *info->dlpi_name)
          static_cast<std::vector<std::string>*>(data)->push_back(info->dlpi_name);
        return 0;
      },
      &out);
  return out;
}

// The loaded library whose file name starts with `stem` ("libcublas.so" does not match
// "libcublasLt.so.13").
[[maybe_unused]] std::string find_loaded(const std::vector<std::string>& libs,
                                         const std::string& stem) {
  for (const auto& p : libs)
    if (std::filesystem::path(p).filename().string().starts_with(stem)) return p;
  return "";
}

[[maybe_unused]] std::string real_dir(const std::string& p) {
  std::error_code ec;
  auto r = std::filesystem::canonical(p, ec);
  return ec ? p : r.string();
}

// Where libcuda.so.1 comes from, or "" with `error` set.
std::string driver_library(std::string* error) {
  void* h = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = ::dlerror();
    *error = e ? e : "dlopen failed";
    return "";
  }
  std::string path = "libcuda.so.1";
  link_map* lm = nullptr;
  if (::dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && *lm->l_name) path = lm->l_name;
  ::dlclose(h);
  return path;
}

class Doctor {
 public:
  explicit Doctor(std::ostream& out) : out_(out) {}
  void ok(const std::string& check, const std::string& detail) { line("OK  ", check, detail); }
  void skip(const std::string& check, const std::string& detail) { line("SKIP", check, detail); }
  void fail(const std::string& check, const std::string& detail, const std::string& fix) {
    line("FAIL", check, detail);
    out_ << "      fix: " << fix << "\n";
  }

 private:
  void line(const char* status, const std::string& check, const std::string& detail) {
    out_ << status << "  " << check << ": " << detail << "\n";
  }
  std::ostream& out_;
};

}  // namespace

std::string devices_report() {
  std::ostringstream r;
  r << build_line() << "\n";
  r << "platform: " << platform_line() << "\n";
  CpuInfo cpu = probe_cpu();
  r << "cpu: " << cpu.model << ", " << cpu.threads << " hardware threads\n";
  r << "  ISA: " << isa_line(cpu) << "\n";
  r << "tbb: " << tbb_version() << "\n";
  CudaProbe p = probe_cuda();
  if (p.built_with_cuda) {
    r << "cuda driver: " << cuda_version_str(p.driver_version)
      << ", runtime: " << cuda_version_str(p.runtime_version) << " (static)\n";
    CudaLibraryVersions v = cuda_library_versions();
    r << "libraries: cuBLAS " << v.cublas << ", cuDNN " << v.cudnn << ", NCCL " << v.nccl << "\n";
  }
  if (p.available && !p.devices.empty()) {
    for (const auto& d : p.devices) r << device_line(d) << "\n";
  } else {
    r << "no CUDA device: " << p.reason << "\n";
  }
  r << "device auto: " << choose_device("auto").reason << "\n";
  return r.str();
}

std::string cuda_probe_kernel(int index) {
  CudaProbe p = probe_cuda();
  if (!p.available) return p.reason;
  if (index < 0 || index >= static_cast<int>(p.devices.size()))
    return "no device cuda:" + std::to_string(index);
#if SLIPSTREAM_HAS_CUDA
  return cuda_rt::run_probe_kernel(index);
#else
  return p.reason;
#endif
}

namespace {

// The CPU path: the processor, TBB, the host memory pool. False when something failed.
bool doctor_cpu(Doctor& doc) {
  CpuInfo cpu = probe_cpu();
  doc.ok("cpu", cpu.model + ", " + std::to_string(cpu.threads) + " threads; " + isa_line(cpu));
  doc.ok("tbb", tbb_version());
  try {
    MemoryPool& host = Pools::host();
    void* blk = host.allocate(1 << 20, "doctor host check");
    host.deallocate(blk, 1 << 20);
    doc.ok("host memory pool", host.name() + ", 1 MiB allocate/free works");
  } catch (const std::exception& e) {
    doc.fail("host memory pool", e.what(), "free host memory, or lower the batch size");
    return false;
  }
  return true;
}

#if SLIPSTREAM_HAS_CUDA
// The toolkit's shared libraries: they must come from the toolkit the build used, else a stray
// LD_LIBRARY_PATH entry may pair this binary with an incompatible cuBLAS or cuDNN. False when one
// is missing or another.
bool doctor_cuda_libraries(Doctor& doc, int runtime) {
  bool ok = true;
  CudaLibraryVersions v = cuda_library_versions();  // first: it loads the ones opened on demand
  const auto libs = loaded_libraries();
  struct Lib {
    const char* stem;
    const char* label;
    std::string version;
    const char* build_dir;
  };
  const Lib wanted[] = {{"libcublas.so", "cublas", v.cublas, SLIPSTREAM_CUDA_LIB_DIR},
                        {"libcublasLt.so", "cublasLt", v.cublas, SLIPSTREAM_CUDA_LIB_DIR},
                        {"libcudnn.so", "cudnn", v.cudnn, SLIPSTREAM_CUDNN_LIB_DIR},
                        {"libnccl.so", "nccl", v.nccl, SLIPSTREAM_NCCL_LIB_DIR}};
  const std::string cudart = find_loaded(libs, "libcudart.so");
  doc.ok("cudart",
         "statically linked (CUDA runtime " + cuda_version_str(runtime) + ")" +
             (cudart.empty() ? "" : "; note: another libcudart is also loaded: " + cudart));
  for (const Lib& lib : wanted) {
    std::string path = find_loaded(libs, lib.stem);
    if (path.empty()) {
      ok = false;
      doc.fail(lib.label, std::string(lib.stem) + "* is not loaded",
               std::string("reinstall the CUDA toolkit libraries into ") + lib.build_dir);
      continue;
    }
    const std::string dir = std::filesystem::path(real_dir(path)).parent_path().string();
    const std::string expect = real_dir(lib.build_dir);
    if (dir != expect) {
      ok = false;
      doc.fail(lib.label, path + " (" + lib.version + "), but this build used " + lib.build_dir,
               "remove the other directory from LD_LIBRARY_PATH, or rebuild against it");
    } else {
      doc.ok(lib.label, path + " (" + lib.version + ")");
    }
  }

  return ok;
}
#endif

}  // namespace

int run_doctor(std::ostream& out, std::string_view device) {
  Doctor doc(out);
  out << build_line() << "\n";
  bool cuda_ok = true;

  bool cpu_ok = doctor_cpu(doc);

  // --- the CUDA path: each link from build to kernel ----------------------------------------
  CudaProbe p = probe_cuda();
  const bool wants_cuda =
      device != "auto" && device != "cpu" && device != "emulated" && !device.empty();
#if SLIPSTREAM_HAS_CUDA
  doc.ok("cuda build", "CUDA " SLIPSTREAM_CUDA_TOOLKIT_VERSION ", archs " SLIPSTREAM_CUDA_ARCHS);
#else
  if (wants_cuda) {
    cuda_ok = false;
    doc.fail("cuda build", p.reason,
             "rebuild with CUDA: cmake -DSLIPSTREAM_CUDA=ON on a machine with nvcc, or use "
             "--device cpu");
  } else {
    doc.skip("cuda build", p.reason);
  }
#endif

  std::string dl_error;
  const std::string libcuda = driver_library(&dl_error);
  const std::string driver_fix =
      "install the NVIDIA driver (it provides libcuda.so.1; in a container, start it with the "
      "NVIDIA container toolkit, e.g. docker run --gpus all), or use --device cpu";
  if (!p.built_with_cuda) {
    doc.skip("nvidia driver", "not used by a CPU-only build (" +
                                  (libcuda.empty() ? "libcuda.so.1 not found" : libcuda) + ")");
  } else if (libcuda.empty()) {
    cuda_ok = false;
    doc.fail("nvidia driver", "libcuda.so.1 cannot be loaded: " + dl_error, driver_fix);
  } else {
    doc.ok("nvidia driver", libcuda);
  }

#if SLIPSTREAM_HAS_CUDA
  const int runtime = cuda_rt::build_runtime_version();
  if (p.driver_version == 0) {
    doc.skip("driver vs runtime", "no driver; this build needs CUDA " + cuda_version_str(runtime));
  } else if (p.driver_version / 1000 < runtime / 1000) {
    cuda_ok = false;
    doc.fail("driver vs runtime",
             "driver supports CUDA " + cuda_version_str(p.driver_version) + ", this build needs " +
                 cuda_version_str(runtime),
             "upgrade the NVIDIA driver to one that supports CUDA " + cuda_version_str(runtime) +
                 ", or rebuild with a toolkit no newer than the driver");
  } else {
    doc.ok("driver vs runtime", "driver CUDA " + cuda_version_str(p.driver_version) +
                                    " >= runtime " + cuda_version_str(runtime));
  }

  if (p.available) {
    std::string list;
    for (const auto& d : p.devices) list += (list.empty() ? "" : "; ") + device_line(d);
    doc.ok("cuda devices", list);
  } else if (libcuda.empty()) {
    doc.skip("cuda devices", "no driver");
  } else {
    cuda_ok = false;
    doc.fail("cuda devices", p.reason,
             "check nvidia-smi lists the GPU and CUDA_VISIBLE_DEVICES is unset or correct; "
             "reinstall the driver if nvidia-smi fails, or use --device cpu");
  }

  cuda_ok = doctor_cuda_libraries(doc, runtime) && cuda_ok;

  if (!p.available) {
    doc.skip("probe kernel", "no CUDA device");
  } else {
    const int index = wants_cuda ? parse_device(device).index : 0;
    std::string problem = cuda_probe_kernel(index);
    if (problem.empty()) {
      doc.ok("probe kernel", "cuda:" + std::to_string(index) + " ran a kernel and read it back");
    } else {
      cuda_ok = false;
      doc.fail("probe kernel", problem,
               "if it says 'no kernel image', rebuild with CMAKE_CUDA_ARCHITECTURES including "
               "this GPU's sm_XY; otherwise reinstall the driver, or use --device cpu");
    }
  }
#endif

  // --- what a run would use ---------------------------------------------------------------------
  try {
    DeviceChoice c = choose_device(device);
    const bool usable = c.device.is_cpu() ? cpu_ok : cpu_ok && cuda_ok;
    if (usable)
      doc.ok("device " + std::string(device), c.reason);
    else
      doc.fail("device " + std::string(device), c.reason + ", but a check above failed",
               "apply the fixes above, or use --device cpu");
    return usable ? 0 : 1;
  } catch (const std::exception& e) {
    doc.fail("device " + std::string(device), e.what(),
             "apply the fixes above, or use --device cpu (or auto)");
    return 1;
  }
}

}  // namespace slipstream
