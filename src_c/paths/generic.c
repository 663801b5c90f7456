/* The portable path: the baseline ISA of the build (SSE2 on x86-64). */
#define ISA generic
#define VEC_BYTES 16
#define ISA_HAS_FMA 0
#include "paths/kernels.h"
