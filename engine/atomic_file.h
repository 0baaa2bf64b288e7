// Files that are replaced whole or not at all: the bytes go to a temporary file beside the target
// (every write checked, errno in the message), which is fsync'd and renamed over the target, and
// the directory entry fsync'd. A reader, or a kill at any point, sees the old file or the new one;
// a full disk leaves the old one untouched and says so. A symlink's target is what is replaced
// (the link stays); a path that is a device, FIFO or folder is refused, never renamed over.
#pragma once

#include <string>
#include <string_view>

namespace slipstream {

class AtomicFile {
 public:
  // Creates the temporary file; throws naming `path` and errno.
  explicit AtomicFile(std::string path);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  // Removes the temporary file unless commit() succeeded: the target is never touched.
  ~AtomicFile();

  void write(const void* data, size_t n);
  void write(std::string_view text) { write(text.data(), text.size()); }
  // fsync, rename over the target, fsync of its directory. Throws naming the path and errno.
  void commit();

  const std::string& path() const { return path_; }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

// `text` as the whole content of `path` through an AtomicFile.
void write_file_atomically(const std::string& path, std::string_view text);

// The directory holding `path` fsync'd: a rename or removal there survives a power loss. Throws
// naming the path and errno.
void sync_parent_directory(const std::string& path);

// What errno says, for messages: "No space left on device".
std::string errno_text(int err);

}  // namespace slipstream
