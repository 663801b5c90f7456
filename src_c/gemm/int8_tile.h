/*
 * The x86 tiles of the int8 products and their driver (see int8.h),
 * included twice by it: with I8_VNNI 1 (VPDPBUSD, AVX512-VNNI; functions
 * suffixed _t1) and 0 (VPMADDWD; _t0). Both compute every int32 sum
 * exactly, so the two agree bitwise with each other and with the C kernel.
 */
#if I8_VNNI
/* acc += the products of the four u8 x s8 pairs of each lane of a and w.
 * In asm, with acc copied in and out of a local: GCC allocates the
 * intrinsic's accumulator apart from the loop's and copies it twice each
 * time through the loop; an asm on the array element itself would keep the
 * array in memory. */
#define I8_DPBUSD(acc, a, w)                                                       \
    do {                                                                           \
        SFX(ivec) t_ = (acc);                                                       \
        __asm__("vpdpbusd %2, %1, %0" : "+v"(t_) : "v"(a), "v"(w));               \
        (acc) = t_;                                                                \
    } while (0)
#define I8MR 8
#define I8F(name) SFX(name##_t1)
#define I8_ATTR __attribute__((target("avx512vnni")))
#else
#define I8F(name) SFX(name##_t0)
#define I8_ATTR
#define I8MR (VEC_BYTES == 64 ? 4 : 2)
#endif
/* Panels a tile of mr rows runs side by side: at least 8 independent sums */
#define I8_NPN(mr) (8 / ((mr) * I8NV) >= I8_NPN_MAX ? I8_NPN_MAX \
                    : 8 / ((mr) * I8NV) > 1 ? 8 / ((mr) * I8NV) : 1)

/* One tile: rows [0, mr) of the quantized A (q rows kp bytes apart, s their
 * scales) against npn panels (pst bytes apart) from column n0 of W; the
 * last panel has ncols columns. Quad by quad, each row's four bytes are
 * broadcast against the panels' vectors; every sum runs over all of K from
 * zero in int32, then is scaled into C. */
static inline __attribute__((always_inline)) I8_ATTR void I8F(i8_tile)(
    float *C, int64_t ldc, const uint8_t *q, int64_t kp, const float *s, const int8_t *P,
    int64_t pst, const SFX(i8w) *W, int64_t n0, int mr, int npn, int ncols)
{
    SFX(ivec) c[I8MR][I8_NPN_MAX * I8NV];
    for (int r = 0; r < mr; r++)
        for (int v = 0; v < npn * I8NV; v++) c[r][v] = VI_ZERO();
    for (int64_t k = 0; k < kp; k += 4) {
#if I8_VNNI
        if (mr == 1) {   /* one row against npn panels: each vector of W once */
            int32_t quad;
            memcpy(&quad, q + k, 4);
            SFX(ivec) a = VI_SET1(quad);
            for (int v = 0; v < npn * I8NV; v++)
                I8_DPBUSD(c[0][v], a,
                          VI_LOAD(P + v / I8NV * pst + k * FASTLN_NR + v % I8NV * 4 * VIL));
            continue;
        }
        SFX(ivec) w[I8_NPN_MAX * I8NV];
        for (int v = 0; v < npn * I8NV; v++)
            w[v] = VI_LOAD(P + v / I8NV * pst + k * FASTLN_NR + v % I8NV * 4 * VIL);
        for (int r = 0; r < mr; r++) {
            int32_t quad;
            memcpy(&quad, q + r * kp + k, 4);
            SFX(ivec) a = VI_SET1(quad);
            for (int v = 0; v < npn * I8NV; v++) I8_DPBUSD(c[r][v], a, w[v]);
        }
#else
        SFX(ivec) a[I8MR];
        for (int r = 0; r < mr; r++) {
            int32_t quad;
            memcpy(&quad, q + r * kp + k, 4);
            a[r] = VI_SET1(quad);
        }
        /* u0 w0 + u2 w2 and u1 w1 + u3 w3 in each lane, from the even and
         * odd bytes widened to 16 bits (u zero-extended, w sign-extended) */
        SFX(ivec) ae[I8MR], ao[I8MR];
        for (int r = 0; r < mr; r++) {
            ae[r] = VI_AND(a[r], VI_SET1(0x00FF00FF));
            ao[r] = VI_SRL16(a[r], 8);
        }
        for (int v = 0; v < npn * I8NV; v++) {
            SFX(ivec) w = VI_LOAD(P + v / I8NV * pst + k * FASTLN_NR + v % I8NV * 4 * VIL);
            SFX(ivec) we = VI_SRA16(VI_SLL16(w, 8), 8), wo = VI_SRA16(w, 8);
            for (int r = 0; r < mr; r++)
                c[r][v] = VI_ADD(c[r][v], VI_ADD(VI_MADD16(ae[r], we), VI_MADD16(ao[r], wo)));
        }
#endif
    }
    for (int g = 0; g < npn; g++) {
        int64_t n = n0 + g * FASTLN_NR;
        int nc = g == npn - 1 ? ncols : FASTLN_NR;
        float sw[FASTLN_NR];
        const float *scale = W->scale + n;
        if (nc < FASTLN_NR) {   /* the last, partial panel: scales zero-padded */
            for (int j = 0; j < FASTLN_NR; j++) sw[j] = j < nc ? scale[j] : 0.0f;
            scale = sw;
        }
        for (int r = 0; r < mr; r++) {
            float out[FASTLN_NR];
            float *dst = nc == FASTLN_NR ? C + r * ldc + n : out;
            for (int v = 0; v < I8NV; v++) {
                SFX(ivec) sum = VI_ADD(c[r][g * I8NV + v], VI_LOAD(W->corr + n + v * VIL));
                V_STORE(dst + v * VIL, V_MUL(VI_TO_V(sum),
                                              V_MUL(V_SET1(s[r]), V_LOAD(scale + v * VIL))));
            }
            if (nc < FASTLN_NR) memcpy(C + r * ldc + n, out, (size_t)nc * sizeof(float));
        }
    }
}

/* Work item it of gemm_i8: a group of gp panels against a block of up to
 * mb rows. */
static inline __attribute__((always_inline)) I8_ATTR void I8F(gemm_i8_item)(
    float *C, int64_t ldc, const uint8_t *q, const float *s, const SFX(i8w) *W, int64_t M,
    int64_t N, int64_t kp, int64_t it, int64_t ng, int gp)
{
    const int64_t pst = FASTLN_NR * kp, mb = (64 / I8MR) * I8MR;
    const int64_t np = (N + FASTLN_NR - 1) / FASTLN_NR;
#define I8_TILE(mm, r, cnt) \
    I8F(i8_tile)(C + (mm) * ldc, ldc, q + (mm) * kp, kp, s + (mm), W->w + p * pst, pst, W, \
                 p * FASTLN_NR, r, cnt, ncols)
    do {
        int64_t p0 = it % ng * gp, m = it / ng * mb, m1 = m + mb < M ? m + mb : M;
        int cnt = np - p0 < gp ? (int)(np - p0) : gp;
        if (gp > 1) {   /* M < I8MR rows against cnt panels at once */
            int64_t p = p0, last = p0 + cnt - 1;
            int ncols = N - last * FASTLN_NR < FASTLN_NR ? (int)(N - last * FASTLN_NR) : FASTLN_NR;
#define I8_SMALL(r)                                 \
    switch (cnt) {                                  \
        case 4: I8_TILE(m, r, 4); break;            \
        case 3: I8_TILE(m, r, 3); break;            \
        case 2: I8_TILE(m, r, 2); break;            \
        default: I8_TILE(m, r, 1); break;           \
    }
            if (M == 1) I8_SMALL(1) else I8_SMALL(2)
#undef I8_SMALL
            break;
        }
        for (int64_t p = p0; p < p0 + cnt; p++) {
            int ncols = N - p * FASTLN_NR < FASTLN_NR ? (int)(N - p * FASTLN_NR) : FASTLN_NR;
            int64_t mm = m;
            for (; mm + I8MR <= m1; mm += I8MR) I8_TILE(mm, I8MR, 1);
            switch (m1 - mm) {
#define I8_TAIL(r) case r: I8_TILE(mm, r, 1); break;
                I8_TAIL(1)
#if I8MR > 2
                I8_TAIL(2) I8_TAIL(3)
#endif
#if I8MR > 4
                I8_TAIL(4) I8_TAIL(5) I8_TAIL(6) I8_TAIL(7)
#endif
#undef I8_TAIL
                default: break;
            }
        }
    } while (0);
#undef I8_TILE
}

/* C (M, N) = A W^T (see gemm_i8 in int8.h): the (panels, block of
 * rows) work items shared by the enclosing team in a static schedule, as
 * the float kernel shares them (so a thread keeps the same panels from step
 * to step), with a barrier at the end; or, with alone, all of them on this
 * thread. Fewer than I8MR rows take several panels a tile. */
static I8_ATTR void I8F(gemm_i8)(float *C, int64_t ldc, const uint8_t *q, const float *s,
                                 const SFX(i8w) *W, int64_t M, int64_t N, int64_t K, int alone)
{
    const int64_t kp = i8_kp(K), mb = (64 / I8MR) * I8MR;
    const int64_t np = (N + FASTLN_NR - 1) / FASTLN_NR, nmb = (M + mb - 1) / mb;
    const int gp = M < I8MR ? I8_NPN(M) : 1;
    const int64_t ng = (np + gp - 1) / gp;
    if (alone) {
        for (int64_t it = 0; it < ng * nmb; it++)
            I8F(gemm_i8_item)(C, ldc, q, s, W, M, N, kp, it, ng, gp);
        return;
    }
#pragma omp for schedule(static) nowait
    for (int64_t it = 0; it < ng * nmb; it++)
        I8F(gemm_i8_item)(C, ldc, q, s, W, M, N, kp, it, ng, gp);
#pragma omp barrier
}

#undef I8F
#undef I8_DPBUSD
#undef I8_ATTR
#undef I8MR
#undef I8_NPN
#undef I8_VNNI
