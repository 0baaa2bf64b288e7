#include "engine/state_io.h"

#include <cstdio>
#include <stdexcept>

namespace slipstream {

void StateWriter::tensor(const std::string& key, const Tensor& t) {
  tensors_[prefix_ + "." + key] =
      t.to(Device::cpu(), "checkpoint tensor");  // written from the host
}
void StateWriter::text(const std::string& key, const std::string& value) {
  meta_[prefix_ + "." + key] = value;
}
void StateWriter::integer(const std::string& key, int64_t value) {
  meta_[prefix_ + "." + key] = std::to_string(value);
}
void StateWriter::number(const std::string& key, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", value);  // plain decimal, and an exact round trip
  meta_[prefix_ + "." + key] = buf;
}

bool StateReader::has(const std::string& key) const {
  return tensors_.count(full(key)) || meta_.count(full(key));
}
void StateReader::missing(const std::string& key) const {
  throw std::runtime_error(file_ + ": checkpoint has no entry '" + full(key) +
                           "' (was it written by a different graph?)");
}
const Tensor& StateReader::tensor(const std::string& key) const {
  auto it = tensors_.find(full(key));
  if (it == tensors_.end()) missing(key);
  return it->second;
}
void StateReader::tensor_into(const std::string& key, Tensor& dst) const {
  const Tensor& src = tensor(key);
  if (!(src.shape() == dst.shape()) || src.dtype() != dst.dtype())
    throw std::runtime_error(file_ + ": '" + full(key) + "' is " + src.describe() +
                             " in the checkpoint but " + dst.describe() +
                             " in this graph (were the sizes changed?)");
  dst.copy_from(src);
}
std::string StateReader::text(const std::string& key) const {
  auto it = meta_.find(full(key));
  if (it == meta_.end()) missing(key);
  return it->second;
}
int64_t StateReader::integer(const std::string& key) const {
  std::string s = text(key);
  try {
    return std::stoll(s);
  } catch (const std::exception&) {
    throw std::runtime_error(file_ + ": '" + full(key) + "' is not an integer: " + s);
  }
}
double StateReader::number(const std::string& key) const {
  std::string s = text(key);
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str()) throw std::runtime_error(file_ + ": '" + full(key) + "' is not a number");
  return v;
}

}  // namespace slipstream
