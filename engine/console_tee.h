// Copies everything written to std::cout and std::cerr into a file as well (a run directory's
// console.log), while it is alive. The file gets what a terminal would finally show: a carriage
// return starts the line over and escape sequences (the live progress line's) are dropped.
#pragma once

#include <memory>
#include <string>

namespace slipstream {

class ConsoleTee {
 public:
  // Appends to `path`; throws naming it when it cannot be opened.
  explicit ConsoleTee(const std::string& path);
  ~ConsoleTee();  // restores std::cout and std::cerr
  // A line for the file only (e.g. an error the caller prints on the terminal itself).
  void note(const std::string& line);
  ConsoleTee(const ConsoleTee&) = delete;
  ConsoleTee& operator=(const ConsoleTee&) = delete;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace slipstream
