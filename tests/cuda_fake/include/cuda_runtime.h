// Fake (tests/cuda_fake): see cuda_runtime_api.h.
#pragma once
#include "cuda_runtime_api.h"
