/* Closes the code of the instruction-set path that begin.h opened. */
#ifdef ISA_TARGET
#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif
#endif
