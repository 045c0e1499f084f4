// Hopper's warpgroup MMA (wgmma, sm_90a only) for attention_tc3.cu: the fences, commit and wait, and
// wgmma.mma_async m64nNk16 bf16 -> f32 with A and B from shared memory (both K-major) or A from registers
// and B MN-major (trans-b). tests/cuda_emu/emulate_cuda.py puts tests/cuda_emu/wgmma_helpers.inc, their
// CPU emulation, in place of this header.
#pragma once

#include <cstdint>

namespace tessel::kernels::cuda {

// cp.async writes shared memory through the generic proxy, wgmma reads it through the async proxy.
__device__ inline void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ inline void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ inline void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ inline void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// The compiler must not move reads of an accumulator above the wait that completes it, nor writes below
// the wgmma that reads it: an empty asm that "modifies" every register pins them in place.
template <int N>
__device__ inline void fence_regs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// The same for A fragments in registers: written before the wgmma.fence, and kept alive (not reused for
// other values) until the wait, since the hardware reads them asynchronously after the issue.
template <int M>
__device__ inline void fence_regs(std::uint32_t (&r)[M][4]) {
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}
// D (64 x N, f32) = A B + (scale_d ? D : 0), A (64 x 16) and B (16 x N) in shared memory, K-major.
template <int N>
__device__ void wgmma_ss(float (&d)[N / 2], std::uint64_t a, std::uint64_t b, int scale_d);
// The same with A from registers (mma.m16n8k16's A fragment per warp) and B MN-major (trans-b 1).
template <int N>
__device__ void wgmma_rs_bt(float (&d)[N / 2], const std::uint32_t (&a)[4], std::uint64_t b, int scale_d);
// The accumulator operands of one wgmma: "+f" for each of d[0 .. n) and the "{%0,...}" list that names them.
#define TESSEL_WG_D8(i) \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define TESSEL_WG_D32 TESSEL_WG_D8(0), TESSEL_WG_D8(8), TESSEL_WG_D8(16), TESSEL_WG_D8(24)
#define TESSEL_WG_D64 TESSEL_WG_D32, TESSEL_WG_D8(32), TESSEL_WG_D8(40), TESSEL_WG_D8(48), TESSEL_WG_D8(56)
#define TESSEL_WG_REGS32 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}"
#define TESSEL_WG_REGS64 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"

template <>
__device__ inline void wgmma_ss<64>(float (&d)[32], std::uint64_t a, std::uint64_t b, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " TESSEL_WG_REGS32 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
               : TESSEL_WG_D32
               : "l"(a), "l"(b), "r"(scale_d));
}
template <>
__device__ inline void wgmma_ss<128>(float (&d)[64], std::uint64_t a, std::uint64_t b, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " TESSEL_WG_REGS64 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
               : TESSEL_WG_D64
               : "l"(a), "l"(b), "r"(scale_d));
}
template <>
__device__ inline void wgmma_rs_bt<64>(float (&d)[32], const std::uint32_t (&a)[4], std::uint64_t b, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " TESSEL_WG_REGS32 ", {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
               : TESSEL_WG_D32
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}
template <>
__device__ inline void wgmma_rs_bt<128>(float (&d)[64], const std::uint32_t (&a)[4], std::uint64_t b, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " TESSEL_WG_REGS64 ", {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
               : TESSEL_WG_D64
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}

#undef TESSEL_WG_D8
#undef TESSEL_WG_D32
#undef TESSEL_WG_D64
#undef TESSEL_WG_REGS32
#undef TESSEL_WG_REGS64

}  // namespace tessel::kernels::cuda
