// Reading and writing the safetensors format (https://huggingface.co/docs/safetensors): an 8-byte
// little-endian header length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__":
// {str: str}}, then the raw little-endian tensor bytes. PyTorch and numpy read these files.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace slipstream {

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;  // host tensors, owned
  std::map<std::string, std::string> metadata;
};

// Writes atomically: a temporary file in the same directory, fsync, rename, fsync of the
// directory. Tensors must be on the host. Throws std::runtime_error naming the path.
void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
enum class SafetensorsRead { everything, metadata };
// Validates the header (offsets in bounds, non-overlapping, sizes match shapes and dtypes) and
// throws std::runtime_error naming the path and what is wrong. `metadata` reads the header
// alone (the file is still checked whole) and leaves `tensors` empty.
SafetensorsFile read_safetensors(const std::string& path,
                                 SafetensorsRead what = SafetensorsRead::everything);

// Integrity: a "crc32c:<tensor>" metadata entry (8 hex digits: CRC-32C of the tensor's bytes) for
// each tensor. read_safetensors checks every tensor that has one and throws naming the file and
// the tensor when its bytes differ: a flipped bit is an error, never a silently other model.
inline constexpr const char* kChecksumPrefix = "crc32c:";
void add_tensor_checksums(const std::map<std::string, Tensor>& tensors,
                          std::map<std::string, std::string>& metadata);

}  // namespace slipstream
