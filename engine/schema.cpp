#include "engine/schema.h"

#include <sstream>
#include <stdexcept>

namespace slipstream {

std::string_view param_type_name(ParamType t) {
  switch (t) {
    case ParamType::boolean:
      return "bool";
    case ParamType::integer:
      return "int";
    case ParamType::number:
      return "float";
    case ParamType::string:
      return "string";
    case ParamType::string_list:
      return "list of strings";
    case ParamType::integer_list:
      return "list of ints";
    case ParamType::number_list:
      return "list of floats";
  }
  return "?";
}

std::string_view stage_role_name(StageRole r) {
  switch (r) {
    case StageRole::source:
      return "source";
    case StageRole::rebatch:
      return "rebatch";
    case StageRole::transform:
      return "transform";
    case StageRole::loss:
      return "loss";
    case StageRole::update:
      return "update";
  }
  return "?";
}

namespace {
std::string number_str(double v) {
  std::ostringstream os;
  os << v;
  std::string s = os.str();
  // Keep floats recognisable as floats in YAML.
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}
template <class T, class F>
std::string list_str(const std::vector<T>& v, F&& f) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + f(v[i]);
  return s + "]";
}
std::string quoted(const std::string& s) {
  bool plain = !s.empty() && s.find_first_of(":#[]{},\"'&*!|>%@`\n ") == std::string::npos;
  if (plain) return s;
  std::string q = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') q += '\\';
    q += c;
  }
  return q + "\"";
}
}  // namespace

std::string param_value_str(const ParamValue& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, bool>)
          return x ? "true" : "false";
        else if constexpr (std::is_same_v<T, int64_t>)
          return std::to_string(x);
        else if constexpr (std::is_same_v<T, double>)
          return number_str(x);
        else if constexpr (std::is_same_v<T, std::string>)
          return quoted(x);
        else if constexpr (std::is_same_v<T, std::vector<std::string>>)
          return list_str(x, quoted);
        else if constexpr (std::is_same_v<T, std::vector<int64_t>>)
          return list_str(x, [](int64_t i) { return std::to_string(i); });
        else
          return list_str(x, number_str);
      },
      v);
}

StageSchema& StageSchema::doc(std::string text) {
  doc_ = std::move(text);
  return *this;
}
StageSchema& StageSchema::family(std::string name) {
  family_ = std::move(name);
  return *this;
}
StageSchema& StageSchema::role(StageRole r) {
  role_ = r;
  return *this;
}
StageSchema& StageSchema::trainable() {
  trainable_ = true;
  return *this;
}
StageSchema& StageSchema::differentiable() {
  differentiable_ = true;
  return *this;
}
StageSchema& StageSchema::passthrough() {
  passthrough_ = true;
  return *this;
}
StageSchema& StageSchema::console_metric(std::string name, std::string label) {
  console_.push_back({std::move(name), std::move(label), false});
  return *this;
}
StageSchema& StageSchema::console_family(std::string prefix, std::string label) {
  console_.push_back({std::move(prefix), std::move(label), true});
  return *this;
}
StageSchema& StageSchema::streaming(Streaming s) {
  streaming_ = s;
  return *this;
}
StageSchema& StageSchema::concurrency(int n) {
  concurrency_ = n;
  return *this;
}
// A schema that contradicts itself is its author's mistake, said when it registers (a plugin's
// load is refused naming it): a second port or parameter of one name would shadow the first.
namespace {
template <class List>
void check_new_name(const List& list, const std::string& name, const std::string& kind,
                    const char* what) {
  for (const auto& e : list)
    if (e.name == name)
      throw std::logic_error("stage kind '" + kind + "' declares " + what + " '" + name +
                             "' twice");
}
}  // namespace

StageSchema& StageSchema::input(std::string name, std::optional<DType> dtype, int rank,
                                std::string doc) {
  check_new_name(inputs_, name, kind_, "input");
  inputs_.push_back({std::move(name), dtype, rank, std::move(doc), false});
  return *this;
}
StageSchema& StageSchema::optional_input(std::string name, std::optional<DType> dtype, int rank,
                                         std::string doc) {
  check_new_name(inputs_, name, kind_, "input");
  inputs_.push_back({std::move(name), dtype, rank, std::move(doc), true});
  return *this;
}
StageSchema& StageSchema::output(std::string name, std::optional<DType> dtype, int rank,
                                 std::string doc) {
  check_new_name(outputs_, name, kind_, "output");
  outputs_.push_back({std::move(name), dtype, rank, std::move(doc), false});
  return *this;
}
StageSchema& StageSchema::reads_bf16_copy() {
  if (inputs_.empty()) throw std::logic_error("StageSchema::reads_bf16_copy before any input");
  if (inputs_.back().dtype && *inputs_.back().dtype != DType::f32)
    throw std::logic_error("StageSchema::reads_bf16_copy: input '" + inputs_.back().name +
                           "' is not f32");
  inputs_.back().reads_bf16_copy = true;
  return *this;
}

namespace {
ParamType type_of(const ParamValue& v) {
  switch (v.index()) {
    case 0:
      return ParamType::boolean;
    case 1:
      return ParamType::integer;
    case 2:
      return ParamType::number;
    case 3:
      return ParamType::string;
    case 4:
      return ParamType::string_list;
    case 5:
      return ParamType::integer_list;
    default:
      return ParamType::number_list;
  }
}
}  // namespace

StageSchema& StageSchema::param(std::string name, ParamValue default_value, std::string doc) {
  check_new_name(params_, name, kind_, "parameter");
  ParamSpec p;
  p.name = std::move(name);
  p.type = type_of(default_value);
  p.default_value = std::move(default_value);
  p.doc = std::move(doc);
  params_.push_back(std::move(p));
  return *this;
}
StageSchema& StageSchema::required_param(std::string name, ParamType type, std::string doc) {
  check_new_name(params_, name, kind_, "parameter");
  ParamSpec p;
  p.name = std::move(name);
  p.type = type;
  p.required = true;
  p.doc = std::move(doc);
  params_.push_back(std::move(p));
  return *this;
}
StageSchema& StageSchema::range(std::optional<double> min, std::optional<double> max) {
  if (params_.empty()) throw std::logic_error("StageSchema::range before any param");
  ParamSpec& p = params_.back();
  if (p.type == ParamType::string || p.type == ParamType::string_list ||
      p.type == ParamType::boolean)
    throw std::logic_error("stage kind '" + kind_ + "': range on parameter '" + p.name +
                           "', which is not a number");
  p.min = min;
  p.max = max;
  if (!p.required)
    if (std::string bad = param_value_problem(p, p.default_value); !bad.empty())
      throw std::logic_error("stage kind '" + kind_ + "': the default of " + bad);
  return *this;
}
StageSchema& StageSchema::in_older_runs(ParamValue value) {
  if (params_.empty()) throw std::logic_error("StageSchema::in_older_runs before any param");
  params_.back().older_runs_value = std::move(value);
  return *this;
}
StageSchema& StageSchema::choices(std::vector<std::string> allowed) {
  if (params_.empty()) throw std::logic_error("StageSchema::choices before any param");
  ParamSpec& p = params_.back();
  if (p.type != ParamType::string && p.type != ParamType::string_list)
    throw std::logic_error("stage kind '" + kind_ + "': choices on parameter '" + p.name +
                           "', which is not a string");
  p.choices = std::move(allowed);
  if (!p.required)
    if (std::string bad = param_value_problem(p, p.default_value); !bad.empty())
      throw std::logic_error("stage kind '" + kind_ + "': the default of " + bad);
  return *this;
}

StageSchema& StageSchema::path(bool must_exist) {
  if (params_.empty()) throw std::logic_error("StageSchema::path before any param");
  if (params_.back().type != ParamType::string && params_.back().type != ParamType::string_list)
    throw std::logic_error("StageSchema::path on a parameter that is not a string or string list");
  params_.back().is_path = true;
  params_.back().must_exist = must_exist;
  return *this;
}

StageSchema& StageSchema::micro_batches() {
  if (params_.empty()) throw std::logic_error("StageSchema::micro_batches before any param");
  if (params_.back().type != ParamType::integer)
    throw std::logic_error("StageSchema::micro_batches on a parameter that is not an integer");
  params_.back().micro_batches = true;
  return *this;
}

StageSchema& StageSchema::batch_size() {
  keyword("auto", kAutoBatchSize);
  params_.back().batch_size = true;
  return *this;
}

StageSchema& StageSchema::keyword(std::string word, int64_t value) {
  if (params_.empty() || params_.back().type != ParamType::integer)
    throw std::logic_error("StageSchema::keyword needs an integer parameter before it");
  params_.back().keyword = std::make_pair(std::move(word), value);
  return *this;
}

StageSchema& StageSchema::check(std::function<std::string(const ParamValue&)> fn) {
  if (params_.empty()) throw std::logic_error("StageSchema::check before any param");
  params_.back().check = std::move(fn);
  return *this;
}

StageSchema& StageSchema::rule(Rule fn) {
  rules_.push_back(std::move(fn));
  return *this;
}

const ParamSpec* StageSchema::find_param(std::string_view name) const {
  for (const auto& p : params_)
    if (p.name == name) return &p;
  return nullptr;
}
const PortSpec* StageSchema::find_input(std::string_view name) const {
  for (const auto& p : inputs_)
    if (p.name == name) return &p;
  return nullptr;
}
const PortSpec* StageSchema::find_output(std::string_view name) const {
  for (const auto& p : outputs_)
    if (p.name == name) return &p;
  return nullptr;
}

namespace {
std::string port_line(const PortSpec& p) {
  std::string t = p.dtype ? std::string(dtype_name(*p.dtype)) : "any";
  std::string r = p.rank < 0 ? "any rank" : "rank " + std::to_string(p.rank);
  return "  " + p.name + "  (" + t + ", " + r + (p.optional ? ", optional" : "") +
         (p.reads_bf16_copy ? ", reads its bf16 copy" : "") + ")  " + p.doc + "\n";
}
}  // namespace

std::string StageSchema::help() const {
  std::ostringstream os;
  os << kind_ << "  [" << (family_.empty() ? "core" : family_) << ", " << stage_role_name(role_)
     << (trainable_ ? ", trainable" : "")
     << (streaming_ == Streaming::recurrent      ? ", streams frame by frame"
         : streaming_ == Streaming::per_position ? ", per position"
                                                 : "")
     << "]\n";
  if (!doc_.empty()) os << "  " << doc_ << "\n";
  os << "\ninputs:\n";
  if (inputs_.empty()) os << "  (none)\n";
  for (const auto& p : inputs_) os << port_line(p);
  os << "\noutputs:\n";
  if (outputs_.empty()) os << "  (none)\n";
  for (const auto& p : outputs_) os << port_line(p);
  os << "\nparams:\n";
  if (params_.empty()) os << "  (none)\n";
  for (const auto& p : params_) {
    os << "  " << p.name << ": " << param_type_name(p.type) << " = "
       << (p.required ? "(required)" : param_value_str(p.default_value));
    if (p.min || p.max) {
      os << "  range [" << (p.min ? number_str(*p.min) : "-inf") << ", "
         << (p.max ? number_str(*p.max) : "inf") << "]";
    }
    if (p.keyword) os << "  or '" << p.keyword->first << "'";
    if (!p.choices.empty()) {
      os << "  one of {";
      for (size_t i = 0; i < p.choices.size(); ++i) os << (i ? ", " : "") << p.choices[i];
      os << "}";
    }
    os << "\n      " << p.doc << "\n";
  }
  return os.str();
}

}  // namespace slipstream
