#include "engine/console_tee.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <mutex>
#include <stdexcept>
#include <streambuf>

namespace slipstream {

namespace {

// The lines a terminal would show, written to `file`: shared by the cout and cerr buffers.
class LineSink {
 public:
  explicit LineSink(const std::string& path) : file_(path, std::ios::app) {
    if (!file_)
      throw std::runtime_error(path + ": cannot open for writing: " + std::strerror(errno));
  }
  ~LineSink() {
    if (!line_.empty()) file_ << line_ << "\n";
  }
  void put(const char* s, std::streamsize n) {
    std::lock_guard lock(mu_);
    for (std::streamsize i = 0; i < n; ++i) {
      const char c = s[i];
      if (in_escape_) {
        // CSI sequences end with a byte in @..~ (the K of ESC [ K).
        if (c != '[' && c >= '@' && c <= '~') in_escape_ = false;
      } else if (c == '\033') {
        in_escape_ = true;
      } else if (c == '\r') {
        line_.clear();
      } else if (c == '\n') {
        file_ << line_ << "\n";
        file_.flush();
        line_.clear();
      } else {
        line_ += c;
      }
    }
  }

 private:
  std::mutex mu_;
  std::ofstream file_;
  std::string line_;
  bool in_escape_ = false;
};

// A terminal that stops taking output (a closed pipe: `slipstream run | head`) is dropped; the
// file goes on, and the stream never turns bad for the run's later lines.
class TeeBuf : public std::streambuf {
 public:
  TeeBuf(std::streambuf* terminal, LineSink& sink) : terminal_(terminal), sink_(sink) {}
  std::streambuf* terminal() const { return terminal_; }

 protected:
  int overflow(int c) override {
    if (c == traits_type::eof()) return traits_type::not_eof(c);
    const char ch = static_cast<char>(c);
    sink_.put(&ch, 1);
    if (!terminal_gone_ && terminal_->sputc(ch) == traits_type::eof()) terminal_gone_ = true;
    return c;
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    sink_.put(s, n);
    if (!terminal_gone_ && terminal_->sputn(s, n) != n) terminal_gone_ = true;
    return n;
  }
  int sync() override {
    if (!terminal_gone_ && terminal_->pubsync() != 0) terminal_gone_ = true;
    return 0;
  }

 private:
  std::streambuf* terminal_;
  LineSink& sink_;
  bool terminal_gone_ = false;
};

}  // namespace

struct ConsoleTee::Impl {
  explicit Impl(const std::string& path)
      : sink(path), out(std::cout.rdbuf(), sink), err(std::cerr.rdbuf(), sink) {}
  LineSink sink;
  TeeBuf out, err;
};

ConsoleTee::ConsoleTee(const std::string& path) : impl_(std::make_unique<Impl>(path)) {
  std::cout.flush();
  std::cout.rdbuf(&impl_->out);
  std::cerr.rdbuf(&impl_->err);
}

void ConsoleTee::note(const std::string& line) {
  impl_->sink.put(line.data(), static_cast<std::streamsize>(line.size()));
  impl_->sink.put("\n", 1);
}

ConsoleTee::~ConsoleTee() {
  std::cout.flush();
  std::cout.rdbuf(impl_->out.terminal());
  std::cerr.rdbuf(impl_->err.terminal());
}

}  // namespace slipstream
