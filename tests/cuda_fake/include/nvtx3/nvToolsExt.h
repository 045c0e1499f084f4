// Fake (tests/cuda_fake): NVTX ranges do nothing here.
#pragma once
inline int nvtxRangePushA(const char*) { return 0; }
inline int nvtxRangePop() { return 0; }
