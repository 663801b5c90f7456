/* The AVX-512 target (x86-64 only), for paths/avx512.c and the
 * norm/avx512/ row kernels: 512-bit vectors, chosen at run time. */
#define ISA avx512
#if defined(__clang__)
#define ISA_TARGET "avx512f,avx512vl,avx512bw,avx512dq,avx512bf16,amx-tile,amx-bf16,avx2,fma"
#else
#define ISA_TARGET "avx512f,avx512vl,avx512bw,avx512dq,avx512bf16,amx-tile,amx-bf16,avx2,fma,prefer-vector-width=512"
#endif
/* avx512bf16, amx-*: only the bfloat16 narrowing and products use them,
 * after run-time checks (fastln_cpu_has_avx512bf16, _amx_bf16); the
 * compiler emits them for no other code. */
#define VEC_BYTES 64
#define ISA_HAS_FMA 1
