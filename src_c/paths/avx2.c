/* The AVX2 + FMA path (x86-64 only), chosen at run time. */
#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#define ISA avx2
#define ISA_TARGET "avx2,fma,f16c"
#define VEC_BYTES 32
#define ISA_HAS_FMA 1
#include "paths/kernels.h"
#endif
