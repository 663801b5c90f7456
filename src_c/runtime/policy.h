/*
 * Run-time policy: for one call, the thread count, whether its outputs are
 * written with non-temporal (streaming) stores, and its tiling, from the
 * call's shape, element size, kind and instruction-set path, the requested
 * thread count, and the machine's cache sizes.
 *
 * Every cache-dependent threshold is a multiple of one cache size, stated
 * once below. The sizes are read once per process: the environment
 * variables FASTLN_L1_BYTES, FASTLN_L2_BYTES and FASTLN_L3_BYTES where set
 * and valid, else sysconf, else sysfs, else cpuid, else the fallback
 * FASTLN_FALLBACK_L*. An override value is a size (fastln_parse_bytes) of
 * at least 1 byte; another is ignored (the Python module warns about it at
 * import).
 */
#ifndef FASTLN_POLICY_H
#define FASTLN_POLICY_H

#include <stdint.h>

/* ---- cache sizes ---- */

/* Bytes: a core's L1 data cache and L2; the L3 the machine reports; l3_shared
 * is 1 where that L3 is shared with unknown neighbours (a virtual machine's
 * guest: the reported L3 is the host's). */
typedef struct {
    double l1, l2, l3;
    int l3_shared;
} fastln_caches;

/* Used when a level cannot be read (the reference machine's sizes) */
#define FASTLN_FALLBACK_L1 (32.0 * 1024)
#define FASTLN_FALLBACK_L2 (1024.0 * 1024)
#define FASTLN_FALLBACK_L3 (32.0 * 1024 * 1024)

/* The sizes in use: detected (with the environment's overrides) on first use */
const fastln_caches *fastln_caches_get(void);
/* Replaces the sizes in use; NULL detects them again (environment, machine).
 * Not to be called while other threads run kernels. */
void fastln_caches_set(const fastln_caches *c);
/* Detects the sizes without the environment: sysconf (use_sysconf), the
 * sysfs cache directory under sysfs_root ("/sys/devices/system/cpu/cpu0/cache"
 * on Linux; NULL skips it), cpuid (use_cpuid), and the fallback for any level
 * still unknown. Returns a bit mask of the levels that fell back (1: L1,
 * 2: L2, 4: L3). */
int fastln_caches_detect(fastln_caches *c, int use_sysconf, const char *sysfs_root,
                         int use_cpuid);
/* The largest size fastln_parse_bytes accepts: 1 PiB */
#define FASTLN_MAX_BYTES 1125899906842624.0
/* The bytes a size gives, or -1 where s is not one. A size is an unsigned
 * decimal integer with an optional binary suffix K, M or G (KiB, MiB, GiB),
 * which may be followed by B or iB; a bare B is allowed too. Letters are
 * case-insensitive and white space around the size is ignored ("48K",
 * " 32mib ", "1G", "4096B"). The value is at most FASTLN_MAX_BYTES; 0 is a
 * size (callers that need at least 1 byte check). The sizes of the cache
 * overrides, of sysfs and of FASTLN_CACHE_LIMIT (through the Python module)
 * are read by this one function. */
double fastln_parse_bytes(const char *s);

/* ---- thresholds: each a multiple of one cache size ---- */

/* The L3 a call counts on: the reported L3, or in a guest at most this many
 * bytes. A guest's reported L3 is its host's, shared with other guests whose
 * use of it is unknown: it counts on one chiplet's L3 (fastln_l3_usable). */
#define FASTLN_GUEST_L3_CAP (32.0 * 1024 * 1024)

/* Outputs of at least L3 bytes stream: with the inputs they exceed the L3
 * and would only evict it. (float64, generic C and AVX2 paths; add +
 * LayerNorm's s and y together.) */
#define FASTLN_STREAM_L3 1.0
/* AVX-512 float32 and 16-bit LayerNorm and RMSNorm forwards on several
 * threads: their rows are staged in L1, so in and out fill the L3 from
 * half of it. */
#define FASTLN_STREAM_AVX512_L3 0.5
/* AVX-512 forwards on one thread: one core's read-for-ownership of y
 * competes with its row reads from a quarter of the L3 (add + LayerNorm:
 * twice it, for s and y). */
#define FASTLN_STREAM_1T_L3 0.25
/* AVX-512 forwards of short rows (16-bit on any thread count, float32 on
 * one): the many-rows kernels keep little in cache, so an eighth of the L3
 * (add + LayerNorm: twice it). */
#define FASTLN_STREAM_SHORT_L3 0.125
/* Backwards read two arrays for each one they write: dx streams from a
 * quarter of the L3. */
#define FASTLN_STREAM_BWD_L3 0.25
/* AVX-512 float32 backwards of rows of up to FASTLN_SHORT_BWD_H elements
 * (the sixteen-row kernel): dx's read-for-ownership competes with the rows'
 * reads from an eighth of the L3. */
#define FASTLN_STREAM_BWD_SHORT_L3 0.125
/* Only rows that fit the L1 stream: a streamed row is staged in L1. */
#define FASTLN_STREAM_ROW_L1 1.0
/* The forwards also prefetch (the short-row ones their outputs, the long-row
 * LayerNorm its inputs) where one thread's rows pass this many bytes. A
 * constant: the kernels read it inside their inlined row loops, where a value
 * read at run time slows them (docs/performance.md). */
#define FASTLN_PF_RANGE_BYTES (4.0 * 1024 * 1024)

/* A backward whose x, dy and dx take at most this many bytes is hot and
 * takes the grouped-rows sweep. It is a crossover between two kernels, not a
 * cache size: a larger L2 does not make the grouped sweep win on larger
 * calls, so it stays a constant. */
#define FASTLN_BWD_HOT_BYTES (2.0 * 1024 * 1024)

/* Row lengths that are kernel shapes, not cache sizes */
#define FASTLN_SHORT_ROW_BYTES 512   /* the short-row forward kernels' rows */
#define FASTLN_SHORT_BWD_H 128       /* the sixteen-row backward's rows */

/* Below this many elements a call stays serial: an OpenMP fork and join
 * costs microseconds, more than a second thread saves on less work. */
#define FASTLN_PAR_MIN_WORK 12288

/* Whether a call of N rows of H elements runs on one thread, whatever the
 * thread count (the caller then need not ask OpenMP for it) */
static inline int fastln_serial(int64_t N, int64_t H)
{
    return N < 2 || N * H < FASTLN_PAR_MIN_WORK;
}

/* ---- the policy ---- */

/* The call's kind */
#define FASTLN_CALL_FWD 0   /* LayerNorm or RMSNorm forward: y */
#define FASTLN_CALL_ADD 1   /* add + LayerNorm: s and y */
#define FASTLN_CALL_BWD 2   /* a backward: dx */

/* The instruction-set path */
#define FASTLN_PATH_GENERIC 0
#define FASTLN_PATH_AVX2 1
#define FASTLN_PATH_AVX512 2

typedef struct {
    int threads;            /* threads to use: 1 runs serially */
    int stream;             /* 1: write the outputs with non-temporal stores */
    double stream_bytes;    /* bytes out from which this kind of call streams */
    int64_t row_block;      /* rows per backward block (fastln_row_block) */
    double bwd_hot_bytes;   /* backward: x, dy and dx up to this are hot */
    double pf_range_bytes;  /* short-row forwards: a thread's rows past this prefetch y */
} fastln_plan;

/* Rows per backward block: depends on N only, never on the thread count or
 * the caches, so that dweight/dbias are reduced in the same order on any
 * thread count and any machine. Up to 16 blocks (16 to 256 rows each): each
 * block's call and partial sums cost time. */
static inline int64_t fastln_row_block(int64_t N)
{
    int64_t rb = (N + 15) / 16;
    return rb < 16 ? 16 : rb > 256 ? 256 : rb;
}

/* The L3 bytes that calls count on, from c */
static inline double fastln_l3_usable(const fastln_caches *c)
{
    return c->l3_shared && c->l3 > FASTLN_GUEST_L3_CAP ? FASTLN_GUEST_L3_CAP : c->l3;
}

/* Bytes out from which a call of this kind streams, on t threads */
static inline double fastln_stream_bytes(int kind, int64_t H, int elsize, int path, int t,
                                         double l3)
{
    const int outs = kind == FASTLN_CALL_ADD ? 2 : 1;
    const int avx512 = path == FASTLN_PATH_AVX512;
    const int short_row = (double)H * elsize <= FASTLN_SHORT_ROW_BYTES;
    if (kind == FASTLN_CALL_BWD) {
        if (elsize == 4 && H <= FASTLN_SHORT_BWD_H && avx512)
            return FASTLN_STREAM_BWD_SHORT_L3 * l3;
        return FASTLN_STREAM_BWD_L3 * l3;
    }
    if (elsize == 8) return FASTLN_STREAM_L3 * l3;
    if (avx512 && short_row && (elsize == 2 || t == 1)) return outs * FASTLN_STREAM_SHORT_L3 * l3;
    if (avx512 && t == 1) return outs * FASTLN_STREAM_1T_L3 * l3;
    if (avx512 && outs == 1) return FASTLN_STREAM_AVX512_L3 * l3;
    return FASTLN_STREAM_L3 * l3;
}

/* The plan for a call of kind (FASTLN_CALL_*) on N rows of H elements of
 * elsize bytes (2: float16/bfloat16 storage, 4, 8) on path (FASTLN_PATH_*),
 * with threads requested (at least 1), on a machine with caches c. */
static inline fastln_plan fastln_policy(int kind, int64_t N, int64_t H, int elsize, int path,
                                        int threads, const fastln_caches *c)
{
    fastln_plan p;
    const double l3 = fastln_l3_usable(c);
    const int64_t rows = kind == FASTLN_CALL_ADD ? 2 * N : N;   /* s and y */
    if (threads < 1) threads = 1;
    p.threads = fastln_serial(N, H) ? 1 : threads < N ? threads : (int)N;
    p.stream_bytes = fastln_stream_bytes(kind, H, elsize, path, p.threads, l3);
    p.stream = (double)H * elsize <= FASTLN_STREAM_ROW_L1 * c->l1 &&
               (double)rows * (double)H * elsize >= p.stream_bytes;
    p.row_block = fastln_row_block(N);
    p.bwd_hot_bytes = FASTLN_BWD_HOT_BYTES;
    p.pf_range_bytes = FASTLN_PF_RANGE_BYTES;
    return p;
}

#endif
