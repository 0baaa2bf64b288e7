// Save/load of stage state for checkpoints. A stage writes named tensors and scalars under its
// own prefix; the checkpoint stage gathers them into a safetensors file (scalars go into its
// metadata; doubles as 17 significant digits, which round-trip bit-exactly).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "engine/tensor.h"

namespace slipstream {

class StateWriter {
 public:
  StateWriter(std::map<std::string, Tensor>& tensors, std::map<std::string, std::string>& meta,
              std::string prefix)
      : tensors_(tensors), meta_(meta), prefix_(std::move(prefix)) {}
  void tensor(const std::string& key, const Tensor& t);  // host copy taken now
  void text(const std::string& key, const std::string& value);
  void integer(const std::string& key, int64_t value);
  void number(const std::string& key, double value);
  const std::string& prefix() const { return prefix_; }

 private:
  std::map<std::string, Tensor>& tensors_;
  std::map<std::string, std::string>& meta_;
  std::string prefix_;
};

class StateReader {
 public:
  StateReader(const std::map<std::string, Tensor>& tensors,
              const std::map<std::string, std::string>& meta, std::string prefix, std::string file)
      : tensors_(tensors), meta_(meta), prefix_(std::move(prefix)), file_(std::move(file)) {}
  bool has(const std::string& key) const;
  // Copies the stored tensor into `dst` (shape and dtype must match; errors name the key).
  void tensor_into(const std::string& key, Tensor& dst) const;
  const Tensor& tensor(const std::string& key) const;
  std::string text(const std::string& key) const;
  int64_t integer(const std::string& key) const;
  double number(const std::string& key) const;

 private:
  std::string full(const std::string& key) const { return prefix_ + "." + key; }
  [[noreturn]] void missing(const std::string& key) const;
  const std::map<std::string, Tensor>& tensors_;
  const std::map<std::string, std::string>& meta_;
  std::string prefix_, file_;
};

}  // namespace slipstream
