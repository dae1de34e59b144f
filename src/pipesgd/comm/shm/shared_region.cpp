#include "pipesgd/comm/shm/shared_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "pipesgd/core/error.h"

namespace pipesgd {

SharedRegion SharedRegion::create(const std::string& name, std::size_t bytes) {
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) throw CommError(concat("shm_open('", name, "') failed: ", std::strerror(errno)));
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int error = errno;
    close(fd);
    shm_unlink(name.c_str());
    throw CommError(concat("ftruncate of shared memory '", name, "' to ", bytes, " bytes failed: ", std::strerror(error)));
  }
  void* address = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int error = errno;
  close(fd);
  if (address == MAP_FAILED) {
    shm_unlink(name.c_str());
    throw CommError(concat("mmap of shared memory '", name, "' failed: ", std::strerror(error)));
  }
  return SharedRegion(address, bytes);
}

SharedRegion SharedRegion::open(const std::string& name, std::size_t bytes) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) throw CommError(concat("shm_open('", name, "') failed: ", std::strerror(errno)));
  struct stat status {};
  if (fstat(fd, &status) != 0 || static_cast<std::size_t>(status.st_size) < bytes) {
    close(fd);
    throw CommError(concat("shared memory '", name, "' is smaller than ", bytes, " bytes"));
  }
  void* address = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int error = errno;
  close(fd);
  if (address == MAP_FAILED) throw CommError(concat("mmap of shared memory '", name, "' failed: ", std::strerror(error)));
  return SharedRegion(address, bytes);
}

void SharedRegion::unlink(const std::string& name) { shm_unlink(name.c_str()); }

SharedRegion SharedRegion::anonymous(std::size_t bytes) {
  void* address = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (address == MAP_FAILED) throw CommError(concat("anonymous shared mmap of ", bytes, " bytes failed: ", std::strerror(errno)));
  return SharedRegion(address, bytes);
}

SharedRegion::SharedRegion(SharedRegion&& other) noexcept
    : address_(std::exchange(other.address_, nullptr)), size_(std::exchange(other.size_, 0)) {}

SharedRegion& SharedRegion::operator=(SharedRegion&& other) noexcept {
  if (this != &other) {
    if (address_) munmap(address_, size_);
    address_ = std::exchange(other.address_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

SharedRegion::~SharedRegion() {
  if (address_) munmap(address_, size_);
}

}  // namespace pipesgd
