/*
 * The instruction-set path in use: chosen at first use from the CPU and the
 * FASTLN_ISA environment variable, or set by fastln_set_isa (fastln.h's
 * "Instruction-set dispatch").
 */
#include "paths/table.h"

/* name in lower case without surrounding white space, into buf of n bytes
 * ("" where it does not fit or is NULL): instruction-set names are
 * case-insensitive ("AVX2" is "avx2") */
static const char *isa_key(const char *name, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = '\0';
    if (!name) return buf;
    while (*name == ' ' || (*name >= '\t' && *name <= '\r')) name++;
    for (; name[len] && len < n; len++)
        buf[len] = name[len] >= 'A' && name[len] <= 'Z' ? (char)(name[len] - 'A' + 'a') : name[len];
    if (len == n) {   /* longer than any name */
        buf[0] = '\0';
        return buf;
    }
    while (len > 0 && (buf[len - 1] == ' ' || (buf[len - 1] >= '\t' && buf[len - 1] <= '\r')))
        len--;
    buf[len] = '\0';
    return buf;
}

#define ISA_KEY(name, buf) isa_key((name), (buf), sizeof(buf))

static const fastln_kernel_table *table_for(const char *raw)
{
    char buf[16];
    const char *name = ISA_KEY(raw, buf);
    if (strcmp(name, "generic") == 0) return &fastln_kernels_generic;
#ifdef FASTLN_X86
    if (strcmp(name, "avx2") == 0) return &fastln_kernels_avx2;
    if (strcmp(name, "avx512") == 0) return &fastln_kernels_avx512;
#endif
    return NULL;
}

int fastln_isa_supported(const char *raw)
{
    char buf[16];
    const char *name = ISA_KEY(raw, buf);
    if (!table_for(name)) return 0;
#if defined(FASTLN_X86) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (strcmp(name, "avx2") == 0)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("f16c");
    if (strcmp(name, "avx512") == 0)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("fma");
    return 1;
#else
    return strcmp(name, "generic") == 0;
#endif
}

static const fastln_kernel_table *g_table = NULL;

/* The best supported path, unless FASTLN_ISA names a supported one (in any
 * case, white space around it ignored). */
static const fastln_kernel_table *choose_table(void)
{
    const char *env = getenv("FASTLN_ISA");
    if (env && *env && fastln_isa_supported(env)) return table_for(env);
    if (fastln_isa_supported("avx512")) return table_for("avx512");
    if (fastln_isa_supported("avx2")) return table_for("avx2");
    return &fastln_kernels_generic;
}

static const fastln_kernel_table *kt(void)
{
    const fastln_kernel_table *t = __atomic_load_n(&g_table, __ATOMIC_ACQUIRE);
    if (!t) {
        t = choose_table();   /* idempotent: a race picks the same table */
        __atomic_store_n(&g_table, t, __ATOMIC_RELEASE);
    }
    return t;
}

const char *fastln_get_isa(void) { return kt()->name; }

const fastln_kernel_table *fastln_kernels(void) { return kt(); }

int fastln_set_isa(const char *name)
{
    if (!fastln_isa_supported(name)) return -1;
    __atomic_store_n(&g_table, table_for(name), __ATOMIC_RELEASE);
    return 0;
}
