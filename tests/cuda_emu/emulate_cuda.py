# Rewrites kernels/cuda/attention_tc2.cu into plain C++ over tests/cuda_emu/ptx_emu.hpp: the inline-PTX
# helpers (pack2 .. cp_async_wait) become calls into the emulation, kernel launches become emu::launch,
# CUDA headers give way to the emulation's. Everything else in the file is compiled as written.
# usage: emulate_cuda.py IN.cu OUT.cpp
import re, sys
src = open(sys.argv[1]).read().split('\n')
out_path = sys.argv[2]
# locate blocks by content, not by number
def find(pred, start=0):
    for i in range(start, len(src)):
        if pred(src[i]): return i
    raise SystemExit('emulate_cuda.py: a marker line was not found in ' + sys.argv[1])
i_pack = find(lambda l: l.startswith('__device__ inline std::uint32_t pack2'))
i_wait_end = find(lambda l: 'cp.async.wait_group' in l, i_pack) + 1  # the closing brace line follows
if src[i_wait_end].strip() != '}':
    raise SystemExit('emulate_cuda.py: cp_async_wait is not the one-line function it expects: ' + src[i_wait_end])
helpers = '''inline std::uint32_t pack2(float lo, float hi) { return std::uint32_t(f2bf(lo)) | (std::uint32_t(f2bf(hi)) << 16); }
inline void mma16816(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) { emu::mma(c, a, b0, b1); }
inline void ldsm_x4(std::uint32_t (&r)[4], const bf16* p) { emu::ldsm(r, p, false); }
inline void ldsm_x4_trans(std::uint32_t (&r)[4], const bf16* p) { emu::ldsm(r, p, true); }
inline void cp_async16(bf16* dst, const bf16* src, bool valid) { emu::cp_async(dst, src, valid); }
inline void cp_async_commit() { emu::commit(); }
template <int N> inline void cp_async_wait() { emu::wait_group(N); }'''
body = src[:i_pack] + [helpers] + src[i_wait_end + 1:]
text = '\n'.join(body)
text = re.sub(r'#include <cuda_bf16.h>\n', '', text)
text = re.sub(r'[ \t]*#pragma unroll\n', '', text)  # nvcc's; the host compiler would warn
text = re.sub(r'#include "kernels/cuda/[a-z_]+\.(cuh|hpp)"\n', '', text)
text = text.replace('namespace tessel::kernels::cuda {', '#include "tests/cuda_emu/ptx_emu.hpp"\nnamespace tessel::kernels::cuda {', 1)
text = text.replace('extern __shared__ __align__(16) unsigned char smem[];', 'unsigned char* smem = emu::tb->smem.data();')
n = 0
def rep(m):
    global n; n += 1
    return 'emu::launch(%s, %s, ' % (m.group(1), m.group(2))
text = re.sub(r'(\w+(?:<\w+>)?)<<<(.*?)>>>\(', rep, text, flags=re.S)
if n != 5:
    raise SystemExit('emulate_cuda.py: expected 5 kernel launches in the file, found %d' % n)
text += '\nnamespace emu { void set_late(int v) { g_late = v; } void reg_ext(const void* p, std::size_t n) { reg(p, n); } }\n'
open(out_path, 'w').write(text)
