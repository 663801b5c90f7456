// fastln from C++: the C header as it is (its declarations are extern "C"),
// three kernels on std::vector buffers, each checked against a plain loop.
// Prints "ok" and exits 0 when every value is within 1e-5 of the reference.
#include <cmath>
#include <cstdio>
#include <vector>

#include "fastln.h"

namespace {

const int64_t N = 48, H = 300;   // rows, elements per row
const double eps = 1e-5;

// the largest |got - want| over the rows; rms: RMSNorm, else LayerNorm
// (no weight or bias)
double worst_error(const std::vector<float> &x, const std::vector<float> &y, bool rms) {
    double worst = 0;
    for (int64_t n = 0; n < N; n++) {
        const float *xr = &x[n * H];
        double m = 0, v = 0;
        if (!rms) {
            for (int64_t j = 0; j < H; j++) m += xr[j];
            m /= H;
        }
        for (int64_t j = 0; j < H; j++) v += (xr[j] - m) * (xr[j] - m);
        double r = 1.0 / std::sqrt(v / H + eps);
        for (int64_t j = 0; j < H; j++)
            worst = std::fmax(worst, std::fabs(y[n * H + j] - (xr[j] - m) * r));
    }
    return worst;
}

bool report(const char *name, int rc, double worst) {
    bool ok = rc == FASTLN_OK && worst <= 1e-5;
    std::printf("%-25s rc %d, max |error| %.2e%s\n", name, rc, worst, ok ? "" : "  FAIL");
    return ok;
}

}  // namespace

int main() {
    std::vector<float> x(N * H), residual(N * H), y(N * H), s(N * H), rstd(N);
    for (int64_t i = 0; i < N * H; i++) {
        x[i] = 3.0f + static_cast<float>(std::sin(0.11 * static_cast<double>(i)));
        residual[i] = static_cast<float>(std::cos(0.07 * static_cast<double>(i)));
    }
    bool ok = true;

    int rc = fastln_layer_norm_f32(y.data(), nullptr, nullptr, x.data(), nullptr, nullptr,
                                   N, H, eps);
    ok &= report("fastln_layer_norm_f32", rc, worst_error(x, y, false));

    rc = fastln_rms_norm_f32(y.data(), rstd.data(), x.data(), nullptr, N, H, eps);
    ok &= report("fastln_rms_norm_f32", rc, worst_error(x, y, true));

    // s = x + residual, y = LayerNorm(s)
    rc = fastln_add_layer_norm_f32(y.data(), s.data(), nullptr, nullptr, x.data(),
                                   residual.data(), nullptr, nullptr, N, H, eps);
    std::vector<float> sum(N * H);
    for (int64_t i = 0; i < N * H; i++) sum[i] = x[i] + residual[i];
    ok &= report("fastln_add_layer_norm_f32", rc, s == sum ? worst_error(sum, y, false) : 1.0);

    // bad sizes are refused, not run
    ok &= fastln_layer_norm_f32(y.data(), nullptr, nullptr, x.data(), nullptr, nullptr,
                                N, 0, eps) == FASTLN_EINVAL;

    std::printf("fastln %s path, %d thread(s) -> %s\n", fastln_get_isa(),
                fastln_get_num_threads(), ok ? "ok" : "FAIL");
    return ok ? 0 : 1;
}
