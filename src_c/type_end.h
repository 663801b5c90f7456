/* Undoes type_begin.h. */
#undef T
#undef SFX
#undef FMA
#undef HSUM
#undef GEMM
#undef AVX512_F32
#undef IS_F32
