// A CPU memory arena for the torch kernels that ORT graphs run (ATen nodes).
//
// ORT's own kernels allocate from ORT's arena, which keeps memory between steps. The torch kernels
// inside the same graph allocate through torch's CPU allocator, that is glibc's malloc, which gives
// the top of its heap back to the system when a step frees it and page-faults it in again, 4 KiB
// at a time, in the next step: thousands of faults per training step on the reference models
// (benchmarks/NOTES.md, finding 40).
//
// While a thread runs an ORT graph (`memory_arena_scope(true)`), CPU allocations of at least
// kMinBytes from that thread are served from blocks freed earlier; frees, from any thread, keep the
// block. All other allocations go to the allocator that was installed before.
//
// A request takes the smallest free block of at least its size and at most a quarter larger (of
// several, the last freed), or a new one. Memory is bounded: the arena holds at most twice the most
// its blocks were ever in use at once, and gives the oldest free blocks back beyond that (shapes
// that vary from step to step). A step whose sizes repeat needs 1.3-1.9 times its peak (the
// reference models), since a block of one size cannot serve another.

#include <ATen/ATen.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/library.h>

#include <pthread.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

namespace {

constexpr size_t kMinBytes = 64 * 1024;

struct Block {
  void* ptr;
  size_t size;
};

// Never destroyed: tensors may be freed during interpreter shutdown, after static destructors.
struct State {
  std::mutex mutex;
  std::map<uint64_t, Block> free_by_age;           // free order -> block, oldest first
  std::multimap<size_t, uint64_t> free_by_size;    // block size -> free order
  std::unordered_map<void*, size_t> in_use;        // arena blocks held by tensors
  uint64_t next_age = 0;
  size_t in_use_bytes = 0;
  size_t peak_in_use_bytes = 0;
  size_t reserved_bytes = 0;
  int64_t reuses = 0;
  int64_t fresh = 0;
  c10::Allocator* previous = nullptr;
  c10::DeleterFnPtr previous_raw_deleter = nullptr;
};

State& state() {
  static State* instance = new State();
  return *instance;
}

thread_local bool enabled = false;

// For torch.profiler(profile_memory=True); called unlocked, as the profiler may allocate.
void report(void* ptr, int64_t bytes, size_t in_use_bytes, size_t reserved_bytes) {
  if (c10::memoryProfilingEnabled()) {
    c10::reportMemoryUsageToProfiler(ptr, bytes, in_use_bytes, reserved_bytes, c10::Device(c10::DeviceType::CPU));
  }
}

// Oldest free blocks until the arena reserves at most `bound` bytes, unlinked from it (the caller
// frees them unlocked).
std::vector<void*> oldest_free_beyond(State& s, size_t bound) {
  std::vector<void*> released;
  while (s.reserved_bytes > bound && !s.free_by_age.empty()) {
    auto oldest = s.free_by_age.begin();
    auto range = s.free_by_size.equal_range(oldest->second.size);
    for (auto it = range.first; it != range.second; ++it) {
      if (it->second == oldest->first) {
        s.free_by_size.erase(it);
        break;
      }
    }
    s.reserved_bytes -= oldest->second.size;
    released.push_back(oldest->second.ptr);
    s.free_by_age.erase(oldest);
  }
  return released;
}

void free_arena_block(void* ptr) {
  State& s = state();
  std::unique_lock<std::mutex> lock(s.mutex);
  auto it = s.in_use.find(ptr);
  if (it == s.in_use.end()) {  // the previous allocator's block, freed through raw_deleter()
    lock.unlock();
    if (s.previous_raw_deleter != nullptr) {
      s.previous_raw_deleter(ptr);
    } else {
      c10::free_cpu(ptr);
    }
    return;
  }
  const size_t size = it->second;
  s.in_use.erase(it);
  s.in_use_bytes -= size;
  const uint64_t age = s.next_age++;
  s.free_by_age.emplace(age, Block{ptr, size});
  s.free_by_size.emplace(size, age);
  const size_t in_use_bytes = s.in_use_bytes, reserved_bytes = s.reserved_bytes;
  lock.unlock();
  report(ptr, -static_cast<int64_t>(size), in_use_bytes, reserved_bytes);
}

struct ArenaAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t bytes) override {
    State& s = state();
    if (!enabled || bytes < kMinBytes) {
      return s.previous->allocate(bytes);
    }
    void* ptr = nullptr;
    size_t size = bytes, in_use_bytes = 0, reserved_bytes = 0;
    std::vector<void*> released;
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      auto fit = s.free_by_size.lower_bound(bytes);
      if (fit != s.free_by_size.end() && fit->first <= bytes + bytes / 4) {  // best fit, at most 25% larger
        fit = std::prev(s.free_by_size.upper_bound(fit->first));  // of that size, the last freed (cache-warm)
        size = fit->first;
        ptr = s.free_by_age.at(fit->second).ptr;
        s.free_by_age.erase(fit->second);
        s.free_by_size.erase(fit);
        s.reuses++;
      } else {
        ptr = c10::alloc_cpu(bytes);
        s.reserved_bytes += size;
        s.fresh++;
      }
      s.in_use.emplace(ptr, size);
      s.in_use_bytes += size;
      s.peak_in_use_bytes = std::max(s.peak_in_use_bytes, s.in_use_bytes);
      released = oldest_free_beyond(s, 2 * s.peak_in_use_bytes);
      in_use_bytes = s.in_use_bytes;
      reserved_bytes = s.reserved_bytes;
    }
    for (void* block : released) {
      c10::free_cpu(block);
    }
    report(ptr, static_cast<int64_t>(size), in_use_bytes, reserved_bytes);
    return {ptr, ptr, &free_arena_block, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &free_arena_block;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

ArenaAllocator& arena() {
  static ArenaAllocator* instance = new ArenaAllocator();
  return *instance;
}

// Make the arena torch's CPU allocator (once per process); false if another allocator of higher
// priority is installed, so that the arena cannot serve anything.
bool install() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.previous == nullptr) {
    c10::Allocator* current = c10::GetCPUAllocator();
    if (current != &arena()) {
      s.previous = current;
      s.previous_raw_deleter = current->raw_deleter();
      c10::SetCPUAllocator(&arena(), /*priority=*/1);
      // A process forked while another thread held the lock (DataLoader workers) gets a usable one.
      pthread_atfork(nullptr, nullptr, [] { new (&state().mutex) std::mutex(); });
    }
  }
  return c10::GetCPUAllocator() == &arena();
}

// Serve this thread's allocations from the arena (true) or not; returns the previous setting.
bool scope(bool on) {
  const bool previous = enabled;
  enabled = on;
  return previous;
}

// Give every free block back to the system (the end of a fit); blocks in use stay the arena's.
void release() {
  State& s = state();
  std::vector<void*> released;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    released = oldest_free_beyond(s, 0);
    s.peak_in_use_bytes = s.in_use_bytes;
  }
  for (void* block : released) {
    c10::free_cpu(block);
  }
}

// [bytes in use, bytes reserved (in use + free), most bytes in use at once, reuses, fresh blocks]
std::vector<int64_t> stats() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return {static_cast<int64_t>(s.in_use_bytes), static_cast<int64_t>(s.reserved_bytes),
          static_cast<int64_t>(s.peak_in_use_bytes), s.reuses, s.fresh};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(lightning_ort, m) {
  m.def("memory_arena_install() -> bool", &install);
  m.def("memory_arena_scope(bool enabled) -> bool", &scope);
  m.def("memory_arena_release() -> ()", &release);
  m.def("memory_arena_stats() -> int[]", &stats);
}
