/*
 * fastln from C, without Python: normalize a buffer of rows with
 * fastln_layer_norm_f32 and check the result against a plain double loop.
 *
 * Build and run against an installed fastln (CMakeLists.txt here; the
 * library's build and install: docs/guide/c-library.md):
 *   cmake -S examples/c -B examples/c/build -DCMAKE_PREFIX_PATH=$PREFIX
 *   cmake --build examples/c/build && examples/c/build/normalize
 * or with pkg-config:
 *   cc normalize.c $(pkg-config --cflags --libs fastln) -lm -o normalize
 * Exits 0 and prints "ok" when every value is within 1e-5 of the reference.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "fastln.h"

enum { N = 64, H = 768 };   /* rows, elements per row */

int main(void)
{
    float *x = malloc(sizeof(float) * N * H), *y = malloc(sizeof(float) * N * H);
    float *weight = malloc(sizeof(float) * H), *bias = malloc(sizeof(float) * H);
    float *mean = malloc(sizeof(float) * N), *rstd = malloc(sizeof(float) * N);
    if (!x || !y || !weight || !bias || !mean || !rstd) return 2;
    for (int i = 0; i < N * H; i++) x[i] = 100.0f + (float)sin(0.37 * i);   /* offset rows */
    for (int j = 0; j < H; j++) {
        weight[j] = 1.0f + 0.001f * (float)j;
        bias[j] = 0.01f * (float)(j % 7);
    }

    /* outputs first, then inputs, then sizes; returns FASTLN_OK (0) on success */
    int rc = fastln_layer_norm_f32(y, mean, rstd, x, weight, bias, N, H, 1e-5);
    if (rc != FASTLN_OK) {
        fprintf(stderr, "fastln_layer_norm_f32 failed: %d\n", rc);
        return 1;
    }

    double worst = 0;
    for (int n = 0; n < N; n++) {   /* the reference: two passes in double */
        const float *xr = x + n * H;
        double m = 0, v = 0;
        for (int j = 0; j < H; j++) m += xr[j];
        m /= H;
        for (int j = 0; j < H; j++) v += (xr[j] - m) * (xr[j] - m);
        double r = 1.0 / sqrt(v / H + 1e-5);
        for (int j = 0; j < H; j++) {
            double want = (xr[j] - m) * r * weight[j] + bias[j];
            double err = fabs(y[n * H + j] - want);
            if (err > worst) worst = err;
        }
    }
    printf("fastln %s path, %d thread(s): max |error| %.2e over %d x %d -> %s\n",
           fastln_get_isa(), fastln_get_num_threads(), worst, N, H,
           worst <= 1e-5 ? "ok" : "FAIL");
    free(x); free(y); free(weight); free(bias); free(mean); free(rstd);
    return worst <= 1e-5 ? 0 : 1;
}
