#pragma once
// SharedRegion: a memory region shared by the processes of one host, the memory a
// SharedMemoryTransport lives in: a POSIX shared-memory object (shm_open, mmap'ed MAP_SHARED) or an
// anonymous shared mapping inherited across fork() (tests). Unmapped on destruction. Creating
// functions throw CommError naming the call that failed.
#include <cstddef>
#include <span>
#include <string>

namespace pipesgd {

class SharedRegion {
 public:
  // Creates the object `name` ("/pipesgd-...", must not exist) of `bytes` zero bytes and maps it.
  static SharedRegion create(const std::string& name, std::size_t bytes);
  // Maps the existing object `name`, which must hold at least `bytes` bytes.
  static SharedRegion open(const std::string& name, std::size_t bytes);
  // Removes `name` (the mappings stay valid); errors are ignored.
  static void unlink(const std::string& name);
  // An anonymous MAP_SHARED mapping of `bytes` zero bytes: shared with children forked afterwards.
  static SharedRegion anonymous(std::size_t bytes);

  SharedRegion() = default;
  SharedRegion(SharedRegion&& other) noexcept;
  SharedRegion& operator=(SharedRegion&& other) noexcept;
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;
  ~SharedRegion();

  std::span<std::byte> bytes() const { return {static_cast<std::byte*>(address_), size_}; }
  bool mapped() const { return address_ != nullptr; }

 private:
  SharedRegion(void* address, std::size_t size) : address_(address), size_(size) {}
  void* address_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace pipesgd
