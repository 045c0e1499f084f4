# Rewrites a kernels/cuda .cu file into plain C++ over tests/cuda_emu/ptx_emu.hpp, to run its own code on
# the CPU: CUDA headers give way to the emulation's, kernel launches become emu::launch, static __shared__
# arrays become function statics (blocks run one at a time, so one copy per kernel is one per block), and
# common.cuh plus the headers named with --inline (device templates the file includes, e.g.
# kernels/cuda/colreduce.cuh) are pasted in. In attention_tc2.cu the inline-PTX helpers (pack2 ..
# cp_async_wait) are swapped for the emulation's ldmatrix, mma and cp.async. The rest compiles as written.
# A file may instead mark its inline-PTX helpers with "// PTX helpers: begin" and "// PTX helpers: end"
# lines; --helpers FILE gives their emulation (attention_tc3.cu: tests/cuda_emu/wgmma_helpers.inc).
# usage: emulate_cuda.py IN.cu OUT.cpp [--inline HEADER ...] [--helpers FILE]
import os, re, sys

args = sys.argv[1:]
if len(args) < 2:
    raise SystemExit('usage: emulate_cuda.py IN.cu OUT.cpp [--inline HEADER ...]')
in_path, out_path, rest = args[0], args[1], args[2:]
inline = []
helpers_file = None
while rest:
    if rest[0] not in ('--inline', '--helpers') or len(rest) < 2:
        raise SystemExit('emulate_cuda.py: unexpected argument ' + rest[0])
    if rest[0] == '--inline':
        inline.append(rest[1])
    else:
        helpers_file = rest[1]
    rest = rest[2:]

src = open(in_path).read().split('\n')

def find(pred, start=0):
    for i in range(start, len(src)):
        if pred(src[i]):
            return i
    return -1

# attention_tc2.cu's inline-PTX helpers
i_pack = find(lambda l: l.startswith('__device__ inline std::uint32_t pack2'))
if i_pack >= 0:
    i_wait = find(lambda l: 'cp.async.wait_group' in l, i_pack)
    if i_wait < 0 or src[i_wait + 1].strip() != '}':
        raise SystemExit('emulate_cuda.py: cp_async_wait is not the one-line function it expects in ' + in_path)
    helpers = '''inline std::uint32_t pack2(float lo, float hi) { return std::uint32_t(f2bf(lo)) | (std::uint32_t(f2bf(hi)) << 16); }
inline void mma16816(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) { emu::mma(c, a, b0, b1); }
inline void ldsm_x4(std::uint32_t (&r)[4], const bf16* p) { emu::ldsm(r, p, false); }
inline void ldsm_x4_trans(std::uint32_t (&r)[4], const bf16* p) { emu::ldsm(r, p, true); }
inline void cp_async16(bf16* dst, const bf16* src, bool valid) { emu::cp_async(dst, src, valid); }
inline void cp_async_commit() { emu::commit(); }
template <int N> inline void cp_async_wait() { emu::wait_group(N); }'''
    src = src[:i_pack] + [helpers] + src[i_wait + 2:]

# marked helpers
i_begin = find(lambda l: l.startswith('// PTX helpers: begin'))
if (i_begin >= 0) != (helpers_file is not None):
    raise SystemExit('emulate_cuda.py: --helpers and a "// PTX helpers: begin" line go together (' + in_path + ')')
if i_begin >= 0:
    i_end = find(lambda l: l.startswith('// PTX helpers: end'), i_begin)
    if i_end < 0:
        raise SystemExit('emulate_cuda.py: no "// PTX helpers: end" line in ' + in_path)
    src = src[:i_begin] + [open(helpers_file).read()] + src[i_end + 1:]

def strip_cuda(text):
    text = re.sub(r'#include <cuda_bf16.h>\n', '', text)
    text = re.sub(r'#include <cuda_runtime.h>\n', '', text)
    text = re.sub(r'#include "kernels/cuda/[a-z0-9_]+\.(cuh|hpp)"\n', '', text)
    text = re.sub(r'#pragma once\n', '', text)
    return re.sub(r'[ \t]*#pragma unroll\n', '', text)  # nvcc's; the host compiler would warn

text = strip_cuda('\n'.join(src))
# common.cuh (warp and block reductions, ceil_div) is part of every kernel file's world.
common = os.path.join(os.path.dirname(os.path.abspath(in_path)), 'common.cuh')
pasted = ''.join(strip_cuda(open(h).read()) + '\n' for h in [common] + inline)
text = text.replace('namespace tessel::kernels::cuda {',
                    '#include "tests/cuda_emu/ptx_emu.hpp"\n' + pasted + 'namespace tessel::kernels::cuda {', 1)
text = text.replace('extern __shared__ __align__(16) unsigned char smem[];', 'unsigned char* smem = emu::tb->smem.data();')
text = re.sub(r'(?<!extern )__shared__ ', 'static ', text)
launches = 0
def rep(m):
    global launches
    launches += 1
    return 'emu::launch(%s, %s, ' % (m.group(1), m.group(2))
text = re.sub(r'(\w+(?:<[^<>;]*>)?)<<<(.*?)>>>\(', rep, text, flags=re.S)
if launches == 0:
    raise SystemExit('emulate_cuda.py: no kernel launch found in ' + in_path)
text += ('\nnamespace emu { void set_late(int v) { g_late = v; } void reg_ext(const void* p, std::size_t n) { reg(p, n); }\n'
         'long last_threads() { return last_launch_threads; } }\n')
open(out_path, 'w').write(text)
