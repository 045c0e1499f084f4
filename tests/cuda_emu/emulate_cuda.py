# Rewrites a kernels/cuda .cu file into plain C++ over tests/cuda_emu/ptx_emu.hpp, to run its own code on
# the CPU: CUDA headers give way to the emulation's, kernel launches become emu::launch, static __shared__
# arrays become function statics (blocks run one at a time, so one copy per kernel is one per block), and
# common.cuh plus the headers named with --inline (device templates the file includes, e.g.
# kernels/cuda/colreduce.cuh) are pasted in. The headers of inline PTX (kernels/cuda/ptx.cuh: ldmatrix, mma,
# cp.async; kernels/cuda/experimental/wgmma.cuh) give way to their emulations (ptx_helpers.inc, wgmma_helpers.inc here).
# The rest compiles as written.
# usage: emulate_cuda.py IN.cu OUT.cpp [--inline HEADER ...]
import os, re, sys

args = sys.argv[1:]
if len(args) < 2:
    raise SystemExit('usage: emulate_cuda.py IN.cu OUT.cpp [--inline HEADER ...]')
in_path, out_path, rest = args[0], args[1], args[2:]
inline = []
while rest:
    if rest[0] != '--inline' or len(rest) < 2:
        raise SystemExit('emulate_cuda.py: unexpected argument ' + rest[0])
    inline.append(rest[1])
    rest = rest[2:]

src = open(in_path).read().split('\n')

# Headers of inline PTX are replaced by their emulations (pasted with common.cuh, after ptx_emu.hpp).
here = os.path.dirname(os.path.abspath(__file__))
EMULATED = {'kernels/cuda/ptx.cuh': os.path.join(here, 'ptx_helpers.inc'),
            'kernels/cuda/experimental/wgmma.cuh': os.path.join(here, 'wgmma_helpers.inc')}
emulated = [inc for hdr, inc in EMULATED.items() if any(l.strip() == '#include "%s"' % hdr for l in src)]

def strip_cuda(text):
    text = re.sub(r'#include <cuda_bf16.h>\n', '', text)
    text = re.sub(r'#include <cuda_runtime.h>\n', '', text)
    text = re.sub(r'#include "kernels/cuda/[a-z0-9_/]+\.(cuh|hpp)"\n', '', text)
    text = re.sub(r'#pragma once\n', '', text)
    return re.sub(r'[ \t]*#pragma unroll\n', '', text)  # nvcc's; the host compiler would warn

text = strip_cuda('\n'.join(src))
# common.cuh (warp and block reductions, ceil_div) is part of every kernel file's world.
common = os.path.join(here, '..', '..', 'kernels', 'cuda', 'common.cuh')
pasted = ''.join(strip_cuda(open(h).read()) + '\n' for h in [common] + emulated + inline)
text = text.replace('namespace tessel::kernels::cuda {',
                    '#include "tests/cuda_emu/ptx_emu.hpp"\n' + pasted + 'namespace tessel::kernels::cuda {', 1)
text = text.replace('extern __shared__ __align__(16) unsigned char smem[];', 'unsigned char* smem = emu::tb->smem.data();')
text = text.replace('extern __shared__ float smem[];', 'float* smem = reinterpret_cast<float*>(emu::tb->smem.data());')
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
