/*
 * isa/: the instruction sets the kernels are compiled for, and the
 * vocabulary they are written in:
 *   isa.h            the platform (FASTLN_X86) and the CPU's optional
 *                    features, as the kernels ask for them at run time (cpu.c)
 *   begin.h, end.h   open and close the code of one instruction-set path
 *                    (its target, FMA); target_avx512.h is the AVX-512 one
 *   type_begin.h, type_end.h   select the element type (float, double) of
 *                    the kernels that follow, and its vectors (vec.h)
 *   vec.h            the one SIMD vocabulary of the kernels written once for
 *                    every path: vectors of T and of int32, and their
 *                    operations
 *   simd.h           SIMD helpers: streaming copies, horizontal sums,
 *                    float16/bfloat16 conversions, and the AVX-512 reductions,
 *                    prefetches and streaming writer
 * isa/ includes runtime/ and the public headers only.
 */
#ifndef FASTLN_ISA_H
#define FASTLN_ISA_H

#include "api/fastln.h"
#include "runtime/runtime.h"

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#define FASTLN_X86 1
#endif

/* Whether the CPU has AVX512-BF16; whether this process may use AMX-BF16
 * tiles; whether the CPU has AVX512-VNNI (cpu.c: decided once; environment
 * variables turn AMX and VNNI off). */
int fastln_cpu_has_avx512bf16(void);
int fastln_cpu_has_amx_bf16(void);
int fastln_cpu_has_avx512vnni(void);

#endif
