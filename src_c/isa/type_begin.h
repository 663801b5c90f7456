/*
 * Selects the element type of the kernels that follow, for the path that
 * begin.h opened: the includer defines IS_F32 (1: float, 0: double).
 *   T          the storage and vector-math type
 *   SFX(f)     name mangling, e.g. f##_f32_avx512
 *   FMA(a,b,c) a*b + c, fused where the ISA has FMA
 *   HSUM(acc)  the horizontal sum of the NACC accumulators of the row
 *              kernels, where the ISA has one (else HSUM_BY_COMPILER)
 *   NRT        the packed products' panel width in elements (FASTLN_NR or
 *              FASTLN_NR_F64), and PACK_NT, PACK_NN, PACKED_SIZE the packers
 *              of gemm/pack.c for T
 *   AVX512_F32 1 for float on AVX-512: the row kernels of norm/avx512/
 *   and the vectors of T (and of int32) and their operations: vec.h
 * type_end.h undoes them. Headers of declarations come before this one: T is
 * a macro up to type_end.h.
 */
#if IS_F32
#define T float
#define SFX(f) CAT3(f, _f32_, ISA)
#define FMA FMA_f32
#define HSUM hsum_f32
#define NRT FASTLN_NR
#define PACK_NT fastln_pack_nt
#define PACK_NN fastln_pack_nn
#define PACKED_SIZE fastln_packed_size
#else
#define T double
#define SFX(f) CAT3(f, _f64_, ISA)
#define FMA FMA_f64
#define HSUM hsum_f64
#define NRT FASTLN_NR_F64
#define PACK_NT fastln_pack_nt_f64
#define PACK_NN fastln_pack_nn_f64
#define PACKED_SIZE fastln_packed_size_f64
#endif
#if IS_F32 && defined(FASTLN_X86) && VEC_BYTES == 64
#define AVX512_F32 1
#else
#define AVX512_F32 0
#endif
#include "isa/vec.h"
