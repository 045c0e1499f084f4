#include "runtime/tensor_parallel.hpp"

#include <algorithm>

namespace tessel::rt {

namespace {
template <class F>
void timed(const TensorParallel& tp, const char* op, std::size_t bytes, F&& f) {
  const double t0 = tp.rec ? tp.rec->now_us() : 0.0;
  f();
  if (tp.rec) tp.rec->record_comm(trace::Stream::tp, op, t0, tp.rec->now_us(), static_cast<double>(bytes));
}
}  // namespace

void TensorParallel::all_reduce(float* x, std::size_t n) const {
  if (size == 1) return;
  timed(*this, "tp_allreduce", n * sizeof(float), [&] { comm->all_reduce(x, n, ReduceOp::sum); });
}

void TensorParallel::all_gather(const float* in, float* out, std::size_t count) const {
  if (size == 1) {
    std::copy(in, in + count, out);
    return;
  }
  timed(*this, "tp_allgather", count * size * sizeof(float), [&] { comm->all_gather(in, out, count); });
}

void TensorParallel::reduce_scatter(const float* in, float* out, std::size_t count) const {
  if (size == 1) {
    std::copy(in, in + count, out);
    return;
  }
  timed(*this, "tp_reducescatter", count * size * sizeof(float),
        [&] { comm->reduce_scatter(in, out, count, ReduceOp::sum); });
}

kernels::cpu::VocabReduce TensorParallel::vocab_hooks() const {
  kernels::cpu::VocabReduce h;
  h.max = [this](float* x, std::size_t n) {
    timed(*this, "tp_allreduce", n * sizeof(float), [&] { comm->all_reduce(x, n, ReduceOp::max); });
  };
  h.sum = [this](float* x, std::size_t n) { all_reduce(x, n); };
  return h;
}

}  // namespace tessel::rt
