/* The AVX-512 path (x86-64 only), chosen at run time: the kernel table, the
 * double kernels, the drivers and the LN-RNN engine; the float row kernels
 * are in norm/avx512/. */
#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#include "isa/target_avx512.h"
#include "paths/kernels.h"
#endif
