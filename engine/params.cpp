#include "engine/params.h"

#include <stdexcept>

namespace slipstream {

std::string SourceMark::str() const {
  if (line <= 0) return file;
  // A checkpoint's weights carry its graph as text in their metadata: the line is that text's
  // (`slipstream.config`, what the run's config.yaml held), not the binary file's.
  if (file.ends_with(".safetensors"))
    return file + " (the graph it carries, line " + std::to_string(line) + " col " +
           std::to_string(col) + ")";
  return file + ":" + std::to_string(line) + ":" + std::to_string(col);
}

void Params::set(const std::string& name, ParamValue value, SourceMark mark, std::string as_given) {
  entries_[name] = Entry{std::move(value), std::move(mark), std::move(as_given)};
}
bool Params::has(std::string_view name) const {
  return entries_.find(name) != entries_.end();
}

const Params::Entry& Params::entry(std::string_view name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw std::out_of_range("no parameter '" + std::string(name) + "'");
  return it->second;
}
const ParamValue& Params::value(std::string_view name) const {
  return entry(name).value;
}
const SourceMark& Params::mark(std::string_view name) const {
  return entry(name).mark;
}

namespace {
template <class T>
const T& get_as(const ParamValue& v, std::string_view name, const char* type) {
  if (auto* p = std::get_if<T>(&v)) return *p;
  throw std::invalid_argument("parameter '" + std::string(name) + "' is not a " + type);
}
}  // namespace

bool Params::boolean(std::string_view n) const {
  return get_as<bool>(value(n), n, "bool");
}
int64_t Params::integer(std::string_view n) const {
  return get_as<int64_t>(value(n), n, "int");
}
double Params::number(std::string_view n) const {
  const auto& v = value(n);
  if (auto* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
  return get_as<double>(v, n, "float");
}
const std::string& Params::string(std::string_view n) const {
  return get_as<std::string>(value(n), n, "string");
}
const std::vector<std::string>& Params::strings(std::string_view n) const {
  return get_as<std::vector<std::string>>(value(n), n, "list of strings");
}
const std::vector<int64_t>& Params::integers(std::string_view n) const {
  return get_as<std::vector<int64_t>>(value(n), n, "list of ints");
}
std::vector<double> Params::numbers(std::string_view n) const {
  const auto& v = value(n);
  if (auto* i = std::get_if<std::vector<int64_t>>(&v)) return {i->begin(), i->end()};
  return get_as<std::vector<double>>(v, n, "list of floats");
}

}  // namespace slipstream
