/* Undoes type_begin.h. */
#undef T
#undef SFX
#undef FMA
#undef HSUM
#undef NRT
#undef PACK_NT
#undef PACK_NN
#undef PACKED_SIZE
#undef AVX512_F32
#undef IS_F32
