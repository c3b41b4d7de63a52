// Copyright 2026 The tfgc Authors.
//
// Fixed blocking of a 1-D range over TensorFlow's intra-op thread pool. The
// blocks do not depend on the thread count's scheduling, so per-block partial
// results combined in block order are deterministic.

#ifndef TFGC_CUSTOM_OPS_CC_KERNELS_PARALLEL_H_
#define TFGC_CUSTOM_OPS_CC_KERNELS_PARALLEL_H_

#include <algorithm>
#include <cstdint>
#include <functional>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/platform/threadpool.h"

namespace tfgc {

class Blocks {
 public:
  // Splits [0, n) into blocks of at least `min_block` elements, about four
  // per thread.
  Blocks(int64_t n, int threads, int64_t min_block = int64_t{1} << 15)
      : n_(n) {
    const int64_t per = (n + 4 * threads - 1) / std::max(1, 4 * threads);
    len_ = std::max(min_block, per);
    count_ = n == 0 ? 0 : (n + len_ - 1) / len_;
  }
  int64_t count() const { return count_; }
  int64_t begin(int64_t b) const { return b * len_; }
  int64_t end(int64_t b) const { return std::min(n_, (b + 1) * len_); }

 private:
  int64_t n_;
  int64_t len_;
  int64_t count_;
};

inline int NumThreads(tensorflow::OpKernelContext* ctx) {
  return ctx->device()->tensorflow_cpu_worker_threads()->num_threads;
}

// Runs fn(b) for every block b, in parallel when there is more than one.
inline void ForEachBlock(tensorflow::OpKernelContext* ctx,
                         const Blocks& blocks,
                         const std::function<void(int64_t)>& fn) {
  if (blocks.count() <= 1) {
    if (blocks.count() == 1) fn(0);
    return;
  }
  auto* workers = ctx->device()->tensorflow_cpu_worker_threads()->workers;
  workers->ParallelFor(
      blocks.count(),
      tensorflow::thread::ThreadPool::SchedulingParams::Fixed(1),
      [&fn](int64_t begin, int64_t end) {
        for (int64_t b = begin; b < end; ++b) fn(b);
      });
}

}  // namespace tfgc

#endif  // TFGC_CUSTOM_OPS_CC_KERNELS_PARALLEL_H_
