/*
 * api/: the C API. fastln.h (the normalization kernels, threads,
 * instruction-set dispatch) and fastln_rnn.h (the recurrent engine) are the
 * public headers, installed as they are; their entry points are here:
 *   norm.c      the normalization kernels, float16/bfloat16 storage
 *   rnn.c       the recurrent engine: checks, weights' layout, both
 *               directions, fastln_rnn_pack
 *   rnn_step.c  one step of a stack of layers over rows of state tables
 * (the threads' functions are in runtime/threads.c, the dispatch's in
 * paths/select.c). They check the arguments, take the run-time policy's plan
 * and call the path in use (paths/table.h).
 * This header declares what the Python package calls beyond the public
 * headers. api/ includes every folder; the others include only its public
 * headers.
 */
#ifndef FASTLN_INTERNAL_H
#define FASTLN_INTERNAL_H

#include <stdint.h>
#include "fastln.h"
#include "fastln_rnn.h"
#include "runtime/runtime.h"   /* fastln_set_default_threads */

/* dst (n) = src (n) converted between float and half storage kind
 * (FASTLN_F16, FASTLN_BF16): with widen uint16_t to float, else float to
 * uint16_t, nearest even; on the threads of a kernel on n values
 * (norm.c). FASTLN_EINVAL for a bad kind or n < 0. */
int fastln_half_convert(int kind, int widen, void *dst, const void *src, int64_t n);

/* dst = src over the threads a kernel would use (the benchmarks' ceiling;
 * norm.c). */
void fastln_parallel_copy(void *dst, const void *src, int64_t nbytes, int nt_stores);

/* Where a bfloat16 layer's products run on the path in use, as the engine
 * chooses (rnn/pack.h: pair panels on the AVX-512 path of a CPU with
 * AVX512-BF16, on AMX tiles where they are usable): "AMX", "AVX512-BF16",
 * or "float32" (weights widened into the float kernels' panels); and an
 * int8 layer's (rnn.c). */
const char *fastln_rnn_bf16_products(void);
const char *fastln_rnn_int8_products(void);

#endif
