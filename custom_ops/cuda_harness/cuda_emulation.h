// Copyright 2026 The tfgc Authors.
//
// A CPU emulation of the subset of CUDA that custom_ops/cc/kernels/*.cu.cc
// use, so that the same kernel source runs, and is checked against numpy, on
// a machine without a GPU. A test tool: no production source includes it.
// The harness build (custom_ops/cuda_harness/run_harness.py --emulate)
// compiles the .cu.cc files as C++ with this header force-included
// (-include), in place of the CUDA headers that cuda_launch.h includes under
// nvcc; it defines TFGC_CUDA_EMULATION, and cudaLaunchKernel, through which
// cuda_launch.h launches kernels under a host compiler.
//
// Execution model (README.md next to this file says what it can catch):
// - Blocks run one after another on the launching thread, so `__shared__`
//   is `static`.
// - The threads of a block are fibers on the launching thread. A fiber runs
//   until it blocks in __syncthreads or a warp intrinsic; which ready fiber
//   runs next is set by a schedule (round-robin, reverse or seeded random),
//   so a missing barrier gives wrong results under some schedule,
//   reproducibly. Fibers rather than OS threads: on two cores a 256-thread
//   barrier costs ~0.9 ms with OS threads, ~0.07 ms with ucontext fibers and
//   ~5 us with the assembly switch below (x86-64), and a stuck barrier is
//   known exactly instead of by a timeout.
// - Every thread of a block (every lane of a warp) must reach the same
//   barrier call site; a barrier that cannot complete, divergent call sites,
//   partial warp masks and launches running past a time limit print a
//   message and abort the process.
// - Device memory is mmap-ed so that each buffer ends at an inaccessible
//   page and starts filled with 0xff bytes; copies, memsets and the pointer
//   arguments of launches are checked against the live device buffers.

#ifndef TFGC_CUSTOM_OPS_CUDA_HARNESS_CUDA_EMULATION_H_
#define TFGC_CUSTOM_OPS_CUDA_HARNESS_CUDA_EMULATION_H_

// What the kernel sources and the harness test for.
#ifndef TFGC_CUDA_EMULATION
#define TFGC_CUDA_EMULATION 1
#endif

#include <math.h>  // fabsf, fmaxf and ::isnan, spelled as in device code
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

// ---------------------------------------------------------------------------
// Qualifiers and built-in variables.
// ---------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
// One block runs at a time, so one static copy per declaration serves as the
// block's shared memory. It keeps its contents from block to block.
#define __shared__ static

struct uint3 {
  unsigned x, y, z;
};

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1)
      : x(vx), y(vy), z(vz) {}
};

// Set by the scheduler before it switches to a fiber; launches are
// serialised, so plain globals suffice.
inline uint3 threadIdx;
inline uint3 blockIdx;
inline dim3 blockDim;
inline dim3 gridDim;

// ---------------------------------------------------------------------------
// Runtime API types (values as in CUDA's driver_types.h).
// ---------------------------------------------------------------------------
enum cudaError_t : int {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevice = 101,
  cudaErrorUnknown = 999,
};

enum cudaMemcpyKind : int {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

enum cudaDeviceAttr : int {
  cudaDevAttrMaxThreadsPerBlock = 1,
  cudaDevAttrMaxGridDimX = 5,
  cudaDevAttrMultiProcessorCount = 16,
};

struct CUstream_st;
using cudaStream_t = CUstream_st*;

struct CUevent_st {
  std::chrono::steady_clock::time_point at;
};
using cudaEvent_t = CUevent_st*;

// ---------------------------------------------------------------------------
// The emulator.
// ---------------------------------------------------------------------------
namespace tfgc {
namespace emu {

enum class Schedule : int { kRoundRobin = 0, kReverse = 1, kRandom = 2 };

// What the emulated device reports and how blocks are scheduled. Small
// values by default so that multi-block and grid-stride paths run.
struct Config {
  int multiprocessors = 2;
  int max_grid_x = 4;
  Schedule schedule = Schedule::kRandom;
  uint64_t seed = 0;
  int launch_timeout_s = 300;
};

inline Config& GetConfig() {
  static Config config;
  return config;
}

inline cudaError_t& LastError() {
  static cudaError_t error = cudaSuccess;
  return error;
}

[[noreturn]] __attribute__((format(printf, 1, 2))) inline void Fatal(
    const char* format, ...) {
  std::fflush(stdout);
  std::fputs("tfgc CUDA emulation: ", stderr);
  va_list args;
  va_start(args, format);
  std::vfprintf(stderr, format, args);
  va_end(args);
  std::fputc('\n', stderr);
  std::fflush(stderr);
  std::abort();
}

// ---------------------------------------------------------------------------
// Device memory: every buffer is its own mapping, right-aligned against a
// PROT_NONE page so that the first byte past its end faults. The start is
// then aligned to the largest power of two dividing the size, which is the
// element alignment for arrays of power-of-two sized elements.
// ---------------------------------------------------------------------------
class DeviceMemory {
 public:
  static DeviceMemory& Get() {
    static DeviceMemory* memory = new DeviceMemory();  // never destroyed
    return *memory;
  }

  cudaError_t Allocate(void** ptr, size_t bytes) {
    InstallFaultHandler();
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t data = (bytes + page - 1) / page * page;
    void* map = mmap(nullptr, data + page, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) return cudaErrorMemoryAllocation;
    char* guard = static_cast<char*>(map) + data;
    if (mprotect(guard, page, PROT_NONE) != 0) {
      munmap(map, data + page);
      return cudaErrorMemoryAllocation;
    }
    char* start = guard - bytes;
    std::memset(start, 0xff, bytes);  // device memory is not zeroed
    std::lock_guard<std::mutex> lock(mu_);
    live_[reinterpret_cast<uintptr_t>(start)] = {map, data + page, bytes};
    *ptr = start;
    return cudaSuccess;
  }

  cudaError_t Free(void* ptr) {
    if (ptr == nullptr) return cudaSuccess;
    Buffer b;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = live_.find(reinterpret_cast<uintptr_t>(ptr));
      if (it == live_.end()) {
        Fatal("cudaFree(%p): not a pointer that cudaMalloc returned", ptr);
      }
      b = it->second;
      live_.erase(it);
    }
    munmap(b.map, b.map_bytes);
    return cudaSuccess;
  }

  // Whether [p, p + bytes) lies in one live buffer (p may be its end when
  // bytes is 0).
  bool Contains(const void* p, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    return Find(reinterpret_cast<uintptr_t>(p), bytes) != nullptr;
  }

  // Writes a message into `out` when `addr` is in the guard page of a live
  // buffer. Called from the SIGSEGV handler: takes no lock (the process is
  // about to abort anyway).
  bool DescribeGuardHit(const void* addr, char* out, size_t size) {
    const auto a = reinterpret_cast<uintptr_t>(addr);
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    for (const auto& [start, b] : live_) {
      const uintptr_t end = start + b.bytes;
      if (a >= end && a < end + page) {
        std::snprintf(out, size,
                      "tfgc CUDA emulation: out-of-bounds access at byte "
                      "%zu of a device buffer of %zu bytes\n",
                      static_cast<size_t>(a - start), b.bytes);
        return true;
      }
    }
    return false;
  }

 private:
  struct Buffer {
    void* map;
    size_t map_bytes;
    size_t bytes;
  };

  const Buffer* Find(uintptr_t p, size_t bytes) const {
    auto it = live_.upper_bound(p);
    if (it == live_.begin()) return nullptr;
    --it;
    const uintptr_t end = it->first + it->second.bytes;
    return p <= end && bytes <= end - p ? &it->second : nullptr;
  }

  static struct sigaction& PreviousHandler() {
    static struct sigaction previous;
    return previous;
  }

  static void OnFault(int sig, siginfo_t* info, void* context) {
    (void)sig;
    (void)context;
    char message[256];
    if (Get().DescribeGuardHit(info->si_addr, message, sizeof(message))) {
      const ssize_t ignored = write(2, message, std::strlen(message));
      (void)ignored;
      std::abort();
    }
    // Not a guard page: give the fault back to the previous handler, which
    // sees it when the access is retried on return.
    sigaction(SIGSEGV, &PreviousHandler(), nullptr);
  }

  static void InstallFaultHandler() {
    static std::once_flag once;
    std::call_once(once, [] {
      struct sigaction action;
      std::memset(&action, 0, sizeof(action));
      action.sa_sigaction = &DeviceMemory::OnFault;
      action.sa_flags = SA_SIGINFO;
      sigemptyset(&action.sa_mask);
      sigaction(SIGSEGV, &action, &PreviousHandler());
    });
  }

  std::mutex mu_;
  std::map<uintptr_t, Buffer> live_;  // by start address
};

inline const char* KindName(cudaMemcpyKind kind) {
  switch (kind) {
    case cudaMemcpyHostToHost:
      return "cudaMemcpyHostToHost";
    case cudaMemcpyHostToDevice:
      return "cudaMemcpyHostToDevice";
    case cudaMemcpyDeviceToHost:
      return "cudaMemcpyDeviceToHost";
    case cudaMemcpyDeviceToDevice:
      return "cudaMemcpyDeviceToDevice";
    case cudaMemcpyDefault:
      return "cudaMemcpyDefault";
  }
  return "an unknown cudaMemcpyKind";
}

// A copy must go between the kinds of memory its `kind` names.
inline void CheckCopy(void* dst, const void* src, size_t bytes,
                      cudaMemcpyKind kind) {
  if (kind == cudaMemcpyDefault) return;
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) {
    Fatal("cudaMemcpy with kind %d", static_cast<int>(kind));
  }
  DeviceMemory& m = DeviceMemory::Get();
  const bool dst_device =
      kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_device =
      kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (dst_device ? !m.Contains(dst, bytes) : m.Contains(dst, 0)) {
    Fatal("%s of %zu bytes: the destination %p is %s", KindName(kind), bytes,
          dst,
          dst_device ? "not inside one device buffer" : "device memory");
  }
  if (src_device ? !m.Contains(src, bytes) : m.Contains(src, 0)) {
    Fatal("%s of %zu bytes: the source %p is %s", KindName(kind), bytes, src,
          src_device ? "not inside one device buffer" : "device memory");
  }
}

// ---------------------------------------------------------------------------
// Fiber contexts. On x86-64 ELF a context switch is a few instructions that
// save the callee-saved registers on the old stack and restore them from the
// new one; swapcontext would also make a system call (the signal mask) on
// every switch. Elsewhere, or with -DTFGC_EMU_UCONTEXT, ucontext is used.
// ---------------------------------------------------------------------------
#if defined(__x86_64__) && defined(__ELF__) && !defined(TFGC_EMU_UCONTEXT)
#define TFGC_EMU_ASM_SWITCH 1
// tfgc_emu_switch(void** save_sp, void* load_sp). Weak, so that every
// translation unit may carry a copy.
asm(R"(
  .pushsection .text
  .weak tfgc_emu_switch
  .hidden tfgc_emu_switch
  .type tfgc_emu_switch, @function
  .p2align 4
tfgc_emu_switch:
  endbr64
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size tfgc_emu_switch, .-tfgc_emu_switch
  .popsection
)");
extern "C" void tfgc_emu_switch(void** save_sp, void* load_sp);

struct Context {
  void* sp;
};

// Lays out [stack, stack + bytes) so that switching to it "returns" into
// `entry` with the stack aligned as after a call.
inline void MakeContext(Context* c, char* stack, size_t bytes,
                        void (*entry)()) {
  auto* top = reinterpret_cast<uintptr_t*>(
      (reinterpret_cast<uintptr_t>(stack) + bytes) & ~uintptr_t{15});
  top[-1] = 0;  // return address of `entry`, which never returns
  top[-2] = reinterpret_cast<uintptr_t>(entry);
  for (int i = 3; i <= 8; ++i) top[-i] = 0;  // rbp, rbx, r12-r15
  c->sp = top - 8;
}

inline void SwitchContext(Context* from, Context* to) {
  tfgc_emu_switch(&from->sp, to->sp);
}
#else
struct Context {
  ucontext_t uc;
};

inline void MakeContext(Context* c, char* stack, size_t bytes,
                        void (*entry)()) {
  if (getcontext(&c->uc) != 0) Fatal("getcontext failed");
  c->uc.uc_stack.ss_sp = stack;
  c->uc.uc_stack.ss_size = bytes;
  c->uc.uc_link = nullptr;  // `entry` never returns
  makecontext(&c->uc, entry, 0);
}

inline void SwitchContext(Context* from, Context* to) {
  if (swapcontext(&from->uc, &to->uc) != 0) Fatal("swapcontext failed");
}
#endif

// ---------------------------------------------------------------------------
// Block execution on fibers.
// ---------------------------------------------------------------------------
class BlockRunner {
 public:
  static BlockRunner& Get() {
    static BlockRunner* runner = new BlockRunner();  // never destroyed
    return *runner;
  }

  // Runs `body` once for every thread of every block of `grid`. `what`
  // names the launch in messages. Returns the launch's error, which is also
  // the last error from then on.
  cudaError_t RunGrid(dim3 grid, dim3 block,
                      const std::function<void()>& body, const char* what) {
    std::lock_guard<std::mutex> lock(launch_mu_);
    const Config& config = GetConfig();
    const uint64_t threads = uint64_t{block.x} * block.y * block.z;
    if (threads == 0 || threads > 1024 || grid.x == 0 || grid.y == 0 ||
        grid.z == 0 || grid.x > static_cast<unsigned>(config.max_grid_x) ||
        grid.y > 65535 || grid.z > 65535) {
      LastError() = cudaErrorInvalidConfiguration;
      return cudaErrorInvalidConfiguration;
    }
    StartWatchdog();
    body_ = &body;
    what_ = what;
    threads_ = static_cast<int>(threads);
    EnsureStacks(threads_);
    blockDim = block;
    gridDim = grid;
    launch_started_ns_.store(NowNs());
    for (unsigned z = 0; z < grid.z; ++z) {
      for (unsigned y = 0; y < grid.y; ++y) {
        for (unsigned x = 0; x < grid.x; ++x) {
          blockIdx = {x, y, z};
          RunBlock();
        }
      }
    }
    launch_started_ns_.store(0);
    body_ = nullptr;
    return cudaSuccess;
  }

  void SyncThreads(const char* file, int line) {
    Fiber& self = Self("__syncthreads", file, line);
    if (block_arrived_ == 0) {
      block_file_ = file;
      block_line_ = line;
    } else if (line != block_line_ || std::strcmp(file, block_file_) != 0) {
      Fatal("divergent __syncthreads in block %s of %s: thread %d is at "
            "%s:%d while others wait at %s:%d",
            BlockName().c_str(), what_, current_, file, line, block_file_,
            block_line_);
    }
    Wait(self, State::kBlockBarrier, "__syncthreads", file, line);
    if (++block_arrived_ == threads_) {
      block_arrived_ = 0;
      for (int t = 0; t < threads_; ++t) {
        if (fibers_[t].state == State::kBlockBarrier) MakeReady(t);
      }
    }
    Suspend();
  }

  // Publishes `bits` for the calling lane and returns the 32 values of its
  // warp once every lane has published (a warp-wide barrier). The result
  // stays valid until the caller's next exchange.
  const uint64_t* WarpExchange(const char* op, const char* file, int line,
                               unsigned mask, uint64_t bits) {
    Fiber& self = Self(op, file, line);
    if (mask != 0xffffffffu) {
      Fatal("%s at %s:%d with mask 0x%08x: only full-warp masks are "
            "emulated",
            op, file, line, mask);
    }
    if (threads_ % 32 != 0) {
      Fatal("%s at %s:%d in a block of %d threads: a full-warp mask needs a "
            "block size that is a multiple of 32",
            op, file, line, threads_);
    }
    WarpState& w = warps_[self.warp];
    if (w.arrived == 0) {
      w.op = op;
      w.file = file;
      w.line = line;
    } else if (std::strcmp(op, w.op) != 0 || line != w.line ||
               std::strcmp(file, w.file) != 0) {
      Fatal("divergent warp in block %s of %s: lane %d of warp %d is at %s "
            "(%s:%d) while other lanes wait at %s (%s:%d)",
            BlockName().c_str(), what_, self.lane, self.warp, op, file, line,
            w.op, w.file, w.line);
    }
    const int phase = w.phase;
    w.values[phase][self.lane] = bits;
    Wait(self, State::kWarpBarrier, op, file, line);
    if (++w.arrived == 32) {
      // Double buffering: a lane can publish into the other half before
      // every lane has read this one, but not into this half again.
      w.arrived = 0;
      w.phase ^= 1;
      for (int t = self.warp * 32; t < self.warp * 32 + 32; ++t) MakeReady(t);
    }
    Suspend();
    return w.values[phase];
  }

  int Lane() const { return fibers_[current_].lane; }

  // Restarts the random schedule, so that a configuration reproduces it.
  void Reseed(uint64_t seed) {
    std::lock_guard<std::mutex> lock(launch_mu_);
    rng_ = seed;
  }

 private:
  enum class State { kReady, kRunning, kBlockBarrier, kWarpBarrier, kDone };

  struct Fiber {
    Context context;
    uint3 idx;
    int warp;
    int lane;
    State state;
    const char* op;  // where it waits
    const char* file;
    int line;
  };

  struct WarpState {
    int arrived;
    int phase;
    const char* op;
    const char* file;
    int line;
    uint64_t values[2][32];
  };

  static constexpr size_t kStackBytes = 64 * 1024;

  // The running fiber; device intrinsics are only valid inside a kernel.
  Fiber& Self(const char* op, const char* file, int line) {
    if (body_ == nullptr || current_ < 0) {
      Fatal("%s at %s:%d outside a kernel launch", op, file, line);
    }
    return fibers_[current_];
  }

  static int64_t NowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  std::string BlockName() const {
    return "(" + std::to_string(blockIdx.x) + "," +
           std::to_string(blockIdx.y) + "," + std::to_string(blockIdx.z) +
           ")";
  }

  // One stack per thread, each above an inaccessible page so that a stack
  // overflow faults instead of corrupting the neighbour.
  void EnsureStacks(int threads) {
    if (threads <= stack_count_) return;
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t slot = kStackBytes + page;
    if (stacks_ != nullptr) munmap(stacks_, slot * stack_count_);
    void* map = mmap(nullptr, slot * threads, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) Fatal("cannot map %d fiber stacks", threads);
    stacks_ = static_cast<char*>(map);
    stack_count_ = threads;
    for (int t = 0; t < threads; ++t) {
      mprotect(stacks_ + slot * t, page, PROT_NONE);
    }
  }

  void RunBlock() {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    fibers_.resize(threads_);
    warps_.assign((threads_ + 31) / 32, WarpState{});
    ready_.clear();
    block_arrived_ = 0;
    done_ = 0;
    for (int t = 0; t < threads_; ++t) {
      Fiber& f = fibers_[t];
      const unsigned u = static_cast<unsigned>(t);
      f.idx = {u % blockDim.x, u / blockDim.x % blockDim.y,
               u / (blockDim.x * blockDim.y)};
      f.warp = t / 32;
      f.lane = t % 32;
      f.op = f.file = "";
      f.line = 0;
      MakeContext(&f.context, stacks_ + (kStackBytes + page) * t + page,
                  kStackBytes, &BlockRunner::Entry);
      MakeReady(t);
    }
    current_ = -1;
    SwitchTo(&main_, Pick());
    // Back here once no fiber is ready: all done, or a barrier is stuck.
    if (done_ != threads_) ReportStuck();
  }

  static void Entry() {
    BlockRunner& r = Get();
    (*r.body_)();
    Fiber& self = r.fibers_[r.current_];
    self.state = State::kDone;
    ++r.done_;
    const int next = r.Pick();
    r.SwitchTo(&self.context, next);  // never resumed
  }

  void Wait(Fiber& self, State state, const char* op, const char* file,
            int line) {
    self.state = state;
    self.op = op;
    self.file = file;
    self.line = line;
  }

  void MakeReady(int t) {
    fibers_[t].state = State::kReady;
    ready_.push_back(t);
  }

  // Removes and returns the next fiber to run under the schedule; -1 when
  // none is ready.
  int Pick() {
    if (ready_.empty()) return -1;
    int t;
    switch (GetConfig().schedule) {
      case Schedule::kRoundRobin:
        t = ready_.front();
        ready_.pop_front();
        break;
      case Schedule::kReverse:
        t = ready_.back();
        ready_.pop_back();
        break;
      default: {
        const size_t i = NextRandom() % ready_.size();
        t = ready_[i];
        ready_[i] = ready_.back();
        ready_.pop_back();
      }
    }
    return t;
  }

  uint64_t NextRandom() {  // SplitMix64
    uint64_t z = (rng_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }

  // The calling fiber has stopped running (waits or is done): runs the next
  // ready one, which may be itself again after it released a barrier.
  void Suspend() {
    Fiber& self = fibers_[current_];
    const int next = Pick();
    if (next == current_) {
      self.state = State::kRunning;
      return;
    }
    SwitchTo(&self.context, next);
  }

  void SwitchTo(Context* from, int next) {
    Context* to = &main_;
    if (next >= 0) {
      current_ = next;
      fibers_[next].state = State::kRunning;
      threadIdx = fibers_[next].idx;
      to = &fibers_[next].context;
    }
    SwitchContext(from, to);
  }

  [[noreturn]] void ReportStuck() {
    // Groups the threads by where they are.
    std::map<std::string, std::vector<int>> where;
    for (int t = 0; t < threads_; ++t) {
      const Fiber& f = fibers_[t];
      std::string key;
      if (f.state == State::kDone) {
        key = "returned";
      } else {
        key = std::string("wait in ") + f.op + " at " + f.file + ":" +
              std::to_string(f.line);
      }
      where[key].push_back(t);
    }
    std::string report;
    for (const auto& [key, ids] : where) {
      report += "\n  " + std::to_string(ids.size()) + " thread(s) " + key +
                ": ";
      for (size_t i = 0; i < ids.size() && i < 8; ++i) {
        report += (i ? ", " : "") + std::to_string(ids[i]);
      }
      if (ids.size() > 8) report += ", ...";
    }
    Fatal("block %s of %s cannot finish: a barrier that not every thread "
          "reaches (or lanes at different barriers):%s",
          BlockName().c_str(), what_, report.c_str());
  }

  // Aborts the process when one launch runs longer than the configured
  // limit (an endless loop in a kernel), so that CI does not hang.
  void StartWatchdog() {
    static std::once_flag once;
    std::call_once(once, [this] {
      std::thread([this] {
        for (;;) {
          std::this_thread::sleep_for(std::chrono::seconds(1));
          const int64_t started = launch_started_ns_.load();
          const int64_t limit =
              int64_t{GetConfig().launch_timeout_s} * 1000000000;
          if (started != 0 && NowNs() - started > limit) {
            Fatal("a launch has run for more than %d s (an endless loop in "
                  "a kernel?): %s",
                  GetConfig().launch_timeout_s, what_);
          }
        }
      }).detach();
    });
  }

  std::mutex launch_mu_;
  const std::function<void()>* body_ = nullptr;
  const char* what_ = "";
  int threads_ = 0;
  std::vector<Fiber> fibers_;
  std::vector<WarpState> warps_;
  std::deque<int> ready_;
  int current_ = -1;
  int done_ = 0;
  int block_arrived_ = 0;
  const char* block_file_ = "";
  int block_line_ = 0;
  Context main_;
  char* stacks_ = nullptr;
  int stack_count_ = 0;
  uint64_t rng_ = 0;
  std::atomic<int64_t> launch_started_ns_{0};
};

// What the host did that a real GPU would make it wait for, or that moves
// data between host and device, counted since the process started, so that
// a test can assert that a launcher keeps its work on the device: `waits`
// counts cudaStreamSynchronize, cudaDeviceSynchronize,
// cudaEventSynchronize and blocking cudaMemcpy calls; `to_host` and
// `from_host` count copies (blocking or not) from and to device memory;
// `launches` counts kernel launches, failed ones included.
struct HostTraffic {
  int64_t waits = 0;
  int64_t to_host = 0;
  int64_t from_host = 0;
  int64_t launches = 0;
};

inline HostTraffic& Traffic() {
  static HostTraffic traffic;
  return traffic;
}

// Counts a copy in Traffic() by where its ends lie.
inline void CountCopy(void* dst, const void* src) {
  DeviceMemory& m = DeviceMemory::Get();
  const bool dst_device = m.Contains(dst, 0);
  const bool src_device = m.Contains(src, 0);
  if (src_device && !dst_device) ++Traffic().to_host;
  if (!src_device && dst_device) ++Traffic().from_host;
}

// Sets what the device reports and how blocks are scheduled; takes effect
// at the next launch (or attribute query).
inline void Configure(const Config& config) {
  GetConfig() = config;
  BlockRunner::Get().Reseed(config.seed);
}

// Kernel parameters that are pointers must point into device memory.
template <typename T>
void CheckArgument(const T& value, size_t index, const char* what) {
  if constexpr (std::is_pointer_v<T>) {
    const void* p = static_cast<const void*>(value);
    if (p != nullptr && !DeviceMemory::Get().Contains(p, 0)) {
      Fatal("argument %zu (%p) of %s is not device memory", index, p, what);
    }
  }
}

template <typename Tuple, size_t... I>
void CheckArguments(const Tuple& args, const char* what,
                    std::index_sequence<I...>) {
  (void)args;  // unused for kernels without parameters
  (void)what;
  (CheckArgument(std::get<I>(args), I, what), ...);
}

// "kernel(const float*, long int, ...)" from the __PRETTY_FUNCTION__ of a
// Launch instantiation (the kernel's own name is not available there).
inline std::string KernelName(const char* pretty) {
  const std::string s = pretty;
  const size_t begin = s.find("Params = {");
  const size_t end = s.find('}', begin);
  if (begin == std::string::npos || end == std::string::npos) return s;
  return "kernel(" + s.substr(begin + 10, end - begin - 10) + ")";
}

// kernel<<<grid, block, shmem, stream>>>(args...): runs the whole grid
// before returning (every stream is synchronous); returns the launch's
// error.
template <typename... Params, typename... Args>
cudaError_t Launch(void (*kernel)(Params...), dim3 grid, dim3 block,
                   size_t shmem, cudaStream_t stream, Args... args) {
  static_assert(sizeof...(Params) == sizeof...(Args),
                "kernel launched with the wrong number of arguments");
  (void)stream;
  ++Traffic().launches;
  static const std::string name = KernelName(__PRETTY_FUNCTION__);
  const char* what = name.c_str();
  if (shmem != 0) Fatal("dynamic shared memory is not emulated: %s", what);
  // Converted once, as a launch does; every thread gets its own copy.
  const std::tuple<std::decay_t<Params>...> params(args...);
  CheckArguments(params, what, std::index_sequence_for<Params...>{});
  const std::function<void()> body = [&] { std::apply(kernel, params); };
  return BlockRunner::Get().RunGrid(grid, block, body, what);
}

// Launch with the parameters' values behind args[i], as cudaLaunchKernel
// passes them.
template <typename... Params, size_t... I>
cudaError_t LaunchWithPointers(void (*kernel)(Params...), dim3 grid,
                               dim3 block, void** args, size_t shmem,
                               cudaStream_t stream,
                               std::index_sequence<I...>) {
  (void)args;  // unused for kernels without parameters
  return Launch(kernel, grid, block, shmem, stream,
                *static_cast<std::decay_t<Params>*>(args[I])...);
}

inline void SyncThreads(const char* file, int line) {
  BlockRunner::Get().SyncThreads(file, line);
}

template <typename T>
uint64_t ToBits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>,
                "warp shuffles exchange at most 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(v));
  return bits;
}

template <typename T>
T FromBits(uint64_t bits) {
  T v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

inline void CheckWidth(const char* op, int width) {
  if (width < 1 || width > 32 || (width & (width - 1)) != 0) {
    Fatal("%s with width %d: must be a power of two in [1, 32]", op, width);
  }
}

// Lane l reads lane l + delta of its width-wide segment; lanes whose source
// would leave the segment keep their own value.
template <typename T>
T ShflDown(const char* file, int line, unsigned mask, T v, unsigned delta,
           int width = 32) {
  CheckWidth("__shfl_down_sync", width);
  BlockRunner& r = BlockRunner::Get();
  const uint64_t* all =
      r.WarpExchange("__shfl_down_sync", file, line, mask, ToBits(v));
  const int lane = r.Lane();
  const bool inside = static_cast<unsigned>(lane % width) + delta <
                      static_cast<unsigned>(width);
  return FromBits<T>(all[inside ? lane + static_cast<int>(delta) : lane]);
}

template <typename T>
T ShflUp(const char* file, int line, unsigned mask, T v, unsigned delta,
         int width = 32) {
  CheckWidth("__shfl_up_sync", width);
  BlockRunner& r = BlockRunner::Get();
  const uint64_t* all =
      r.WarpExchange("__shfl_up_sync", file, line, mask, ToBits(v));
  const int lane = r.Lane();
  const bool inside = static_cast<unsigned>(lane % width) >= delta;
  return FromBits<T>(all[inside ? lane - static_cast<int>(delta) : lane]);
}

inline unsigned Ballot(const char* file, int line, unsigned mask, int pred) {
  const uint64_t* all = BlockRunner::Get().WarpExchange(
      "__ballot_sync", file, line, mask, pred != 0 ? 1 : 0);
  unsigned word = 0;
  for (int lane = 0; lane < 32; ++lane) {
    word |= static_cast<unsigned>(all[lane]) << lane;
  }
  return word;
}

template <typename T>
T AtomicAdd(T* address, T value) {
  if constexpr (std::is_integral_v<T>) {
    return __atomic_fetch_add(address, value, __ATOMIC_RELAXED);
  } else {  // no fetch_add for floating point: compare and swap
    T old, sum;
    __atomic_load(address, &old, __ATOMIC_RELAXED);
    do {
      sum = old + value;
    } while (!__atomic_compare_exchange(address, &old, &sum, false,
                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return old;
  }
}

}  // namespace emu
}  // namespace tfgc

// ---------------------------------------------------------------------------
// Device functions. The macros record the call site for the barrier checks.
// ---------------------------------------------------------------------------
#define __syncthreads() ::tfgc::emu::SyncThreads(__FILE__, __LINE__)
#define __shfl_down_sync(...) \
  ::tfgc::emu::ShflDown(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_up_sync(...) ::tfgc::emu::ShflUp(__FILE__, __LINE__, __VA_ARGS__)
#define __ballot_sync(...) ::tfgc::emu::Ballot(__FILE__, __LINE__, __VA_ARGS__)

inline int atomicAdd(int* address, int value) {
  return tfgc::emu::AtomicAdd(address, value);
}
inline unsigned atomicAdd(unsigned* address, unsigned value) {
  return tfgc::emu::AtomicAdd(address, value);
}
inline unsigned long long atomicAdd(unsigned long long* address,
                                    unsigned long long value) {
  return tfgc::emu::AtomicAdd(address, value);
}
inline float atomicAdd(float* address, float value) {
  return tfgc::emu::AtomicAdd(address, value);
}
inline double atomicAdd(double* address, double value) {
  return tfgc::emu::AtomicAdd(address, value);
}

// The correctly rounded float32 operations of the CUDA math API (to
// nearest even), which nvcc never contracts into a fused multiply-add. Each
// result passes through a volatile so that the host compiler cannot fuse
// them either (emulation_flags() also turns contraction off). Subnormals
// are kept, as on a device built without -ftz=true, unless the calling
// thread flushes them (MXCSR FTZ and DAZ).
inline float __fadd_rn(float a, float b) {
  volatile float r = a + b;
  return r;
}
inline float __fsub_rn(float a, float b) {
  volatile float r = a - b;
  return r;
}
inline float __fmul_rn(float a, float b) {
  volatile float r = a * b;
  return r;
}
inline float __fdiv_rn(float a, float b) {
  volatile float r = a / b;
  return r;
}
inline float __fsqrt_rn(float a) {
  volatile float r = sqrtf(a);
  return r;
}

// Bit counts of the CUDA math API (__clzll(0) is 64, as on the device).
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clzll(long long x) {
  return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x));
}

// ---------------------------------------------------------------------------
// Half and bfloat16: the bit layouts of cuda_fp16.h / cuda_bf16.h with the
// conversions the kernels use, rounding to nearest even as the device does
// (a NaN becomes the canonical 0x7fff, as on the device).
// ---------------------------------------------------------------------------
struct __half {
  uint16_t x;
};

struct __nv_bfloat16 {
  uint16_t x;
};

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// The bit reinterpretations of the CUDA math API.
inline unsigned __float_as_uint(float f) { return FloatBits(f); }
inline float __uint_as_float(unsigned u) { return BitsFloat(u); }

inline float __half2float(__half h) {
  const uint32_t sign = uint32_t{h.x & 0x8000u} << 16;
  const uint32_t exp = (h.x >> 10) & 0x1f;
  const uint32_t mant = h.x & 0x3ff;
  if (exp == 0x1f) return BitsFloat(sign | 0x7f800000u | mant << 13);
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in float
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return BitsFloat(sign | (exp + 112) << 23 | mant << 13);
}

inline __half __float2half_rn(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return {0x7fff};                   // NaN
  if (a >= 0x477ff000u) return {uint16_t(sign | 0x7c00)};  // >= 65520: inf
  if (a <= 0x33000000u) return {sign};  // <= 2^-25: ties to even zero
  uint32_t h, rem, half;
  if (a >= 0x38800000u) {  // normal half (>= 2^-14)
    h = ((a >> 23) - 112) << 10 | (a & 0x7fffffu) >> 13;
    rem = a & 0x1fffu;
    half = 0x1000u;
  } else {  // subnormal half: units of 2^-24
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - (a >> 23);  // 14..24
    h = m >> shift;
    rem = m & ((1u << shift) - 1);
    half = 1u << (shift - 1);
  }
  // A carry out of the mantissa correctly bumps the exponent.
  if (rem > half || (rem == half && (h & 1u))) ++h;
  return {static_cast<uint16_t>(sign | h)};
}

inline float __bfloat162float(__nv_bfloat16 b) {
  return BitsFloat(uint32_t{b.x} << 16);
}

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {0x7fff};  // NaN
  const uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  return {static_cast<uint16_t>(rounded >> 16)};
}

// ---------------------------------------------------------------------------
// Runtime API. There is one device (0) and every call is synchronous.
// ---------------------------------------------------------------------------
inline cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}

inline cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}

inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr,
                                          int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  const tfgc::emu::Config& config = tfgc::emu::GetConfig();
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock:
      *value = 1024;
      return cudaSuccess;
    case cudaDevAttrMaxGridDimX:
      *value = config.max_grid_x;
      return cudaSuccess;
    case cudaDevAttrMultiProcessorCount:
      *value = config.multiprocessors;
      return cudaSuccess;
  }
  return cudaErrorInvalidValue;
}

// The runtime API's launch, which cuda_launch.h's LaunchKernel calls under a
// host compiler (typed, as the template overload of cuda_runtime.h):
// args[i] points to the value of the kernel's parameter i.
template <typename... Params>
cudaError_t cudaLaunchKernel(void (*func)(Params...), dim3 gridDim,
                             dim3 blockDim, void** args, size_t sharedMem = 0,
                             cudaStream_t stream = nullptr) {
  return tfgc::emu::LaunchWithPointers(func, gridDim, blockDim, args,
                                       sharedMem, stream,
                                       std::index_sequence_for<Params...>{});
}

inline cudaError_t cudaGetLastError() {
  const cudaError_t error = tfgc::emu::LastError();
  tfgc::emu::LastError() = cudaSuccess;
  return error;
}

inline cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  return tfgc::emu::DeviceMemory::Get().Allocate(ptr, bytes);
}

inline cudaError_t cudaFree(void* ptr) {
  return tfgc::emu::DeviceMemory::Get().Free(ptr);
}

inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes,
                                   cudaMemcpyKind kind,
                                   cudaStream_t stream = nullptr) {
  (void)stream;
  tfgc::emu::CheckCopy(dst, src, bytes, kind);
  tfgc::emu::CountCopy(dst, src);
  if (bytes != 0) std::memmove(dst, src, bytes);
  return cudaSuccess;
}

inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes,
                              cudaMemcpyKind kind) {
  ++tfgc::emu::Traffic().waits;
  return cudaMemcpyAsync(dst, src, bytes, kind);
}

inline cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes,
                                   cudaStream_t stream = nullptr) {
  (void)stream;
  if (!tfgc::emu::DeviceMemory::Get().Contains(dst, bytes)) {
    tfgc::emu::Fatal("cudaMemsetAsync of %zu bytes at %p: not inside one "
                     "device buffer",
                     bytes, dst);
  }
  std::memset(dst, value, bytes);
  return cudaSuccess;
}

inline cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  (void)stream;
  ++tfgc::emu::Traffic().waits;
  return cudaSuccess;
}

inline cudaError_t cudaDeviceSynchronize() {
  ++tfgc::emu::Traffic().waits;
  return cudaSuccess;
}

inline cudaError_t cudaEventCreate(cudaEvent_t* event) {
  *event = new CUevent_st();
  return cudaSuccess;
}

inline cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}

inline cudaError_t cudaEventRecord(cudaEvent_t event,
                                   cudaStream_t stream = nullptr) {
  (void)stream;
  event->at = std::chrono::steady_clock::now();
  return cudaSuccess;
}

inline cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  (void)event;
  ++tfgc::emu::Traffic().waits;
  return cudaSuccess;
}

inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start,
                                        cudaEvent_t stop) {
  *ms = std::chrono::duration<float, std::milli>(stop->at - start->at).count();
  return cudaSuccess;
}

#endif  // TFGC_CUSTOM_OPS_CUDA_HARNESS_CUDA_EMULATION_H_
