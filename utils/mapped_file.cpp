// Read-only file mappings, and the SIGBUS handler that names the mapped file a fault came from.
#include "utils/mapped_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <utility>

namespace bridge::utils {
namespace {

// The live mappings, for the signal handler: it may only read lock-free atomics and plain memory published before
// them, so the paths are copied into fixed buffers and a slot is published by storing its start address last.
struct Slot {
  std::atomic<bool> claimed{false};
  std::atomic<const unsigned char*> begin{nullptr};
  std::size_t size = 0;
  std::array<char, 1024> path{};
};
std::array<Slot, 256> g_slots;
struct sigaction g_previous_action {};

// Appends to a fixed buffer without allocating (the handler may run inside malloc).
class SignalMessage {
 public:
  SignalMessage& operator<<(const char* text) {
    while (*text != '\0' && length_ < buffer_.size()) buffer_[length_++] = *text++;
    return *this;
  }
  SignalMessage& operator<<(std::size_t value) {
    char digits[24];
    int n = 0;
    do {
      digits[n++] = static_cast<char>('0' + value % 10);
      value /= 10;
    } while (value != 0);
    while (n > 0 && length_ < buffer_.size()) buffer_[length_++] = digits[--n];
    return *this;
  }
  void write_to_stderr() const {
    std::size_t written = 0;
    while (written < length_) {
      const ssize_t n = ::write(STDERR_FILENO, buffer_.data() + written, length_ - written);
      if (n <= 0) return;
      written += static_cast<std::size_t>(n);
    }
  }

 private:
  std::array<char, 2048> buffer_{};
  std::size_t length_ = 0;
};

void on_sigbus(int, siginfo_t* info, void*) {
  const auto* address = static_cast<const unsigned char*>(info->si_addr);
  for (const Slot& slot : g_slots) {
    const unsigned char* begin = slot.begin.load(std::memory_order_acquire);
    if (begin == nullptr || address < begin || address >= begin + slot.size) continue;
    SignalMessage message;
    message << "bridge: SIGBUS reading " << slot.path.data() << " at byte " << static_cast<std::size_t>(address - begin)
            << " of the " << slot.size
            << " it had when opened: the file shrank or its storage failed while it was in use. Do not rewrite or "
               "truncate data files during a run; check the file (rebuild it if it is damaged) and start again.\n";
    message.write_to_stderr();
    break;
  }
  // The faulting read runs again on return and meets the previous handler, or the default action that ends the
  // process with SIGBUS as it would have without this handler.
  ::sigaction(SIGBUS, &g_previous_action, nullptr);
}

void install_sigbus_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action {};
    action.sa_sigaction = on_sigbus;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGBUS, &action, &g_previous_action);
  });
}

int record(const std::string& path, const unsigned char* begin, std::size_t size) {
  for (std::size_t i = 0; i < g_slots.size(); ++i) {
    Slot& slot = g_slots[i];
    bool expected = false;
    if (!slot.claimed.compare_exchange_strong(expected, true)) continue;
    slot.size = size;
    const std::size_t n = std::min(path.size(), slot.path.size() - 1);
    std::memcpy(slot.path.data(), path.data(), n);
    slot.path[n] = '\0';
    slot.begin.store(begin, std::memory_order_release);
    return static_cast<int>(i);
  }
  return -1;  // more live mappings than slots: this one faults without its name, as before
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace

MappedFile::MappedFile(std::string path) : path_(std::move(path)) {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot open " + path_ + ": " + errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string error = errno_text();
    ::close(fd);
    throw std::runtime_error("cannot stat " + path_ + ": " + error);
  }
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ > 0) {
    void* data = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (data == MAP_FAILED) {
      const std::string error = errno_text();
      ::close(fd);
      throw std::runtime_error("cannot memory-map " + path_ + ": " + error);
    }
    data_ = static_cast<const unsigned char*>(data);
    install_sigbus_handler();
    slot_ = record(path_, data_, size_);
  }
  ::close(fd);  // the mapping stays valid without the descriptor
}

MappedFile::~MappedFile() {
  if (slot_ >= 0) {
    Slot& slot = g_slots[static_cast<std::size_t>(slot_)];
    slot.begin.store(nullptr, std::memory_order_release);
    slot.claimed.store(false, std::memory_order_release);
  }
  if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), size_);
}

}  // namespace bridge::utils
