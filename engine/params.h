// A stage's resolved parameter values, each remembering where it was set (file:line:col), so a
// stage's own checks can point the user at the line to change.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "engine/schema.h"

namespace slipstream {

struct SourceMark {
  std::string file;  // config file path, or "<--set #N>" / "<default>"
  int line = 0;      // 1-based; 0 when unknown
  int col = 0;       // 1-based
  // "file:line:col" (or just "file"); in a checkpoint's weights, "file (the graph it carries,
  // line L col C)"
  std::string str() const;
};

class Params {
 public:
  void set(const std::string& name, ParamValue value, SourceMark mark = {},
           std::string as_given = {});
  bool has(std::string_view name) const;
  const ParamValue& value(std::string_view name) const;  // throws std::out_of_range naming it
  const SourceMark& mark(std::string_view name) const;

  bool boolean(std::string_view name) const;
  int64_t integer(std::string_view name) const;
  double number(std::string_view name) const;  // integers convert
  const std::string& string(std::string_view name) const;
  const std::vector<std::string>& strings(std::string_view name) const;
  const std::vector<int64_t>& integers(std::string_view name) const;
  std::vector<double> numbers(std::string_view name) const;  // integer lists convert

  struct Entry {
    ParamValue value;
    SourceMark mark;
    std::string as_given;  // a path parameter's text before it was made absolute (else empty)
  };
  const std::map<std::string, Entry, std::less<>>& entries() const { return entries_; }

 private:
  const Entry& entry(std::string_view name) const;
  std::map<std::string, Entry, std::less<>> entries_;
};

}  // namespace slipstream
