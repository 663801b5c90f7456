/* A cache of large buffers, for the Python layer's NumPy allocator
 * (fastln/_core.pyx) and the recurrent engine's packed weights
 * (rnn/pack.h, rnn/products.h): a block freed here is kept and handed to
 * the next allocation of about its size, so that a loop of allocating calls
 * does not pay the page faults of fresh memory each call
 * (docs/performance.md, "Output memory", has the cost), and blocks of
 * FASTLN_POOL_MIN_BYTES or more ask for transparent huge pages. Plain C99
 * plus the __atomic builtins of GCC and clang.
 * Thread-safe: the cache is taken with a try-lock, and a call that finds it
 * busy allocates or frees without it. */
#ifndef FASTLN_POOL_H
#define FASTLN_POOL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Blocks of at least this many bytes are worth keeping: below it the C
 * heap reuses freed memory itself (glibc: up to its 32 MiB mmap threshold,
 * once a block of the size has been freed). */
#define FASTLN_POOL_MIN_BYTES ((size_t)4 << 20)

/* A 64-byte aligned block of at least nbytes (any size; 0 is taken as 1),
 * from the cache where a kept block is at least nbytes and at most 1/8
 * larger, else new. NULL when memory runs out. */
void *fastln_pool_alloc(size_t nbytes);
/* As fastln_pool_alloc, zeroed. */
void *fastln_pool_calloc(size_t nbytes);
/* Gives back a block of fastln_pool_alloc (NULL: nothing): kept when it is of
 * at least FASTLN_POOL_MIN_BYTES and the cache stays within its limit (the
 * oldest kept blocks are released to make room), else released. */
void fastln_pool_free(void *p);
/* Resizes a block of fastln_pool_alloc (p NULL: allocates), keeping its
 * first min(old, new) bytes; NULL when memory runs out (p is then left as
 * it was). */
void *fastln_pool_realloc(void *p, size_t nbytes);

/* The most bytes the cache keeps (0: it keeps none, and releases what it
 * holds); the initial limit is FASTLN_POOL_DEFAULT_LIMIT. */
#define FASTLN_POOL_DEFAULT_LIMIT ((size_t)1 << 30)
void fastln_pool_set_limit(size_t bytes);
/* Releases every kept block. */
void fastln_pool_release(void);

typedef struct {
    size_t limit;        /* fastln_pool_set_limit's bytes */
    size_t bytes;        /* bytes of the kept blocks */
    size_t blocks;       /* kept blocks */
    size_t hits;         /* allocations served from the cache */
    size_t misses;       /* allocations of FASTLN_POOL_MIN_BYTES or more served fresh */
} fastln_pool_stats;
void fastln_pool_get_stats(fastln_pool_stats *s);

#ifdef __cplusplus
}
#endif
#endif /* FASTLN_POOL_H */
