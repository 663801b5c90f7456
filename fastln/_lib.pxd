# The C-level interface of fastln._lib. The kernels are compiled into
# fastln._lib alone; fastln's other extension modules (fastln._rows,
# fastln.rnn._engine) and other packages' Cython code (through
# fastln/kernels.pxd) call them through the functions declared here, which
# Cython exports from fastln._lib and resolves when the calling module is
# imported. The process thus holds one copy of the kernels' state: the thread
# count, the instruction-set path and the cache of large outputs.
from libc.stdint cimport int64_t, uint16_t

# The C functions of fastln.h under Cython names of their own (_c_ for
# fastln_), so that the names fastln_* below are the exported functions.
cdef extern from "fastln.h" nogil:
    int FASTLN_OK, FASTLN_ENOMEM, FASTLN_EINVAL, FASTLN_F16, FASTLN_BF16
    int _c_layer_norm_f32 "fastln_layer_norm_f32"(float *y, float *mean, float *rstd,
                                                  const float *x, const float *weight,
                                                  const float *bias, int64_t N, int64_t H,
                                                  double eps)
    int _c_layer_norm_f64 "fastln_layer_norm_f64"(double *y, double *mean, double *rstd,
                                                  const double *x, const double *weight,
                                                  const double *bias, int64_t N, int64_t H,
                                                  double eps)
    int _c_layer_norm_backward_f32 "fastln_layer_norm_backward_f32"(
            float *dx, float *dweight, float *dbias, const float *dy, const float *x,
            const float *mean, const float *rstd, const float *weight, int64_t N, int64_t H)
    int _c_layer_norm_backward_f64 "fastln_layer_norm_backward_f64"(
            double *dx, double *dweight, double *dbias, const double *dy, const double *x,
            const double *mean, const double *rstd, const double *weight, int64_t N, int64_t H)
    int _c_add_layer_norm_f32 "fastln_add_layer_norm_f32"(
            float *y, float *s, float *mean, float *rstd, const float *x, const float *residual,
            const float *weight, const float *bias, int64_t N, int64_t H, double eps)
    int _c_add_layer_norm_f64 "fastln_add_layer_norm_f64"(
            double *y, double *s, double *mean, double *rstd, const double *x,
            const double *residual, const double *weight, const double *bias, int64_t N, int64_t H,
            double eps)
    int _c_add_norm_f32 "fastln_add_norm_f32"(int rms, float *y, float *s, float *mean, float *rstd,
                                              const float *x, const float *residual, int64_t R,
                                              const float *input_bias, const float *weight,
                                              const float *bias, int64_t N, int64_t H, double eps)
    int _c_add_norm_f64 "fastln_add_norm_f64"(int rms, double *y, double *s, double *mean,
                                              double *rstd, const double *x, const double *residual,
                                              int64_t R, const double *input_bias,
                                              const double *weight, const double *bias, int64_t N,
                                              int64_t H, double eps)
    int _c_add_norm_backward_f32 "fastln_add_norm_backward_f32"(
            int rms, float *dsum, float *dweight, float *dbias, float *dinput_bias, const float *dy,
            const float *s, const float *ds, const float *mean, const float *rstd,
            const float *weight, int64_t N, int64_t H)
    int _c_add_norm_backward_f64 "fastln_add_norm_backward_f64"(
            int rms, double *dsum, double *dweight, double *dbias, double *dinput_bias,
            const double *dy, const double *s, const double *ds, const double *mean,
            const double *rstd, const double *weight, int64_t N, int64_t H)
    int _c_rms_norm_f32 "fastln_rms_norm_f32"(float *y, float *rstd, const float *x,
                                              const float *weight, int64_t N, int64_t H, double eps)
    int _c_rms_norm_f64 "fastln_rms_norm_f64"(double *y, double *rstd, const double *x,
                                              const double *weight, int64_t N, int64_t H,
                                              double eps)
    int _c_layer_norm_channels_f32 "fastln_layer_norm_channels_f32"(
            float *y, float *mean, float *rstd, const float *x, const float *weight,
            const float *bias, int64_t N, int64_t C, int64_t S, double eps)
    int _c_layer_norm_channels_f64 "fastln_layer_norm_channels_f64"(
            double *y, double *mean, double *rstd, const double *x, const double *weight,
            const double *bias, int64_t N, int64_t C, int64_t S, double eps)
    int _c_layer_norm_channels_backward_f32 "fastln_layer_norm_channels_backward_f32"(
            float *dx, float *dweight, float *dbias, const float *dy, const float *x,
            const float *mean, const float *rstd, const float *weight, int64_t N, int64_t C,
            int64_t S)
    int _c_layer_norm_channels_backward_f64 "fastln_layer_norm_channels_backward_f64"(
            double *dx, double *dweight, double *dbias, const double *dy, const double *x,
            const double *mean, const double *rstd, const double *weight, int64_t N, int64_t C,
            int64_t S)
    int _c_rms_norm_channels_f32 "fastln_rms_norm_channels_f32"(
            float *y, float *rstd, const float *x, const float *weight, int64_t N, int64_t C,
            int64_t S, double eps)
    int _c_rms_norm_channels_f64 "fastln_rms_norm_channels_f64"(
            double *y, double *rstd, const double *x, const double *weight, int64_t N, int64_t C,
            int64_t S, double eps)
    int _c_rms_norm_channels_backward_f32 "fastln_rms_norm_channels_backward_f32"(
            float *dx, float *dweight, const float *dy, const float *x, const float *rstd,
            const float *weight, int64_t N, int64_t C, int64_t S)
    int _c_rms_norm_channels_backward_f64 "fastln_rms_norm_channels_backward_f64"(
            double *dx, double *dweight, const double *dy, const double *x, const double *rstd,
            const double *weight, int64_t N, int64_t C, int64_t S)
    int _c_rms_norm_backward_f32 "fastln_rms_norm_backward_f32"(
            float *dx, float *dweight, const float *dy, const float *x, const float *rstd,
            const float *weight, int64_t N, int64_t H)
    int _c_rms_norm_backward_f64 "fastln_rms_norm_backward_f64"(
            double *dx, double *dweight, const double *dy, const double *x, const double *rstd,
            const double *weight, int64_t N, int64_t H)
    void _c_set_num_threads "fastln_set_num_threads"(int n)
    int _c_get_requested_threads "fastln_get_requested_threads"()
    int _c_get_num_threads "fastln_get_num_threads"()
    int _c_has_openmp "fastln_has_openmp"()
    const char *_c_get_isa "fastln_get_isa"()
    int _c_set_isa "fastln_set_isa"(const char *name)
    int _c_isa_supported "fastln_isa_supported"(const char *name)
    int _c_layer_norm_half "fastln_layer_norm_half"(int kind, uint16_t *y, float *mean, float *rstd,
                                                    const uint16_t *x, const float *weight,
                                                    const float *bias, int64_t N, int64_t H,
                                                    double eps)
    int _c_layer_norm_backward_half "fastln_layer_norm_backward_half"(
            int kind, uint16_t *dx, float *dweight, float *dbias, const uint16_t *dy,
            const uint16_t *x, const float *mean, const float *rstd, const float *weight, int64_t N,
            int64_t H)
    int _c_add_layer_norm_half "fastln_add_layer_norm_half"(
            int kind, uint16_t *y, uint16_t *s, float *mean, float *rstd, const uint16_t *x,
            const uint16_t *residual, const float *weight, const float *bias, int64_t N, int64_t H,
            double eps)
    int _c_add_norm_half "fastln_add_norm_half"(int kind, int rms, uint16_t *y, uint16_t *s,
                                                float *mean, float *rstd, const uint16_t *x,
                                                const uint16_t *residual, int64_t R,
                                                const float *input_bias, const float *weight,
                                                const float *bias, int64_t N, int64_t H, double eps)
    int _c_rms_norm_half "fastln_rms_norm_half"(int kind, uint16_t *y, float *rstd,
                                                const uint16_t *x, const float *weight, int64_t N,
                                                int64_t H, double eps)
    int _c_rms_norm_backward_half "fastln_rms_norm_backward_half"(
            int kind, uint16_t *dx, float *dweight, const uint16_t *dy, const uint16_t *x,
            const float *rstd, const float *weight, int64_t N, int64_t H)

cdef extern from "fastln_rnn.h" nogil:
    ctypedef struct fastln_rnn_args:
        int cell
        int64_t steps, batch, input, hidden
        double eps
        const void *params[10]
        const int64_t *lengths
        void *h
        void *c
        void *dh
        void *dc
        const void *x
        void *y
        void *cache
        const void *dy
        void *dx
        void *grads[10]
        void *work
        int (*interrupt)(void *ctx) noexcept
        void *interrupt_ctx
        int reverse
        int64_t ldy
        int wtype
        const void *packed
        int transposed
        const float *scales[2]
        int64_t proj
        const float *scale_hr
    ctypedef struct fastln_rnn_step_args:
        const fastln_rnn_args *layers
        int64_t num_layers, batch, table_rows
        const int64_t *rows
        void *h
        void *c
        const void *h_in
        const void *c_in
        const void *x
        void *y
    int FASTLN_EINTR
    int FASTLN_RNN_W_BF16
    int FASTLN_RNN_W_INT8
    int FASTLN_RNN_W_IH_T
    int FASTLN_RNN_W_HH_T
    int FASTLN_RNN_W_HR_T

# fastln.h's functions under their C names, with the same arguments and
# results: each calls the C function of the same name (src_c/api/fastln.h
# documents them)
cdef int fastln_layer_norm_f32(float *y, float *mean, float *rstd, const float *x,
                               const float *weight, const float *bias, int64_t N, int64_t H,
                               double eps) noexcept nogil
cdef int fastln_layer_norm_f64(double *y, double *mean, double *rstd, const double *x,
                               const double *weight, const double *bias, int64_t N, int64_t H,
                               double eps) noexcept nogil
cdef int fastln_layer_norm_backward_f32(float *dx, float *dweight, float *dbias, const float *dy,
                                        const float *x, const float *mean, const float *rstd,
                                        const float *weight, int64_t N, int64_t H) noexcept nogil
cdef int fastln_layer_norm_backward_f64(double *dx, double *dweight, double *dbias,
                                        const double *dy, const double *x, const double *mean,
                                        const double *rstd, const double *weight, int64_t N,
                                        int64_t H) noexcept nogil
cdef int fastln_add_layer_norm_f32(float *y, float *s, float *mean, float *rstd, const float *x,
                                   const float *residual, const float *weight, const float *bias,
                                   int64_t N, int64_t H, double eps) noexcept nogil
cdef int fastln_add_layer_norm_f64(double *y, double *s, double *mean, double *rstd,
                                   const double *x, const double *residual, const double *weight,
                                   const double *bias, int64_t N, int64_t H,
                                   double eps) noexcept nogil
cdef int fastln_add_norm_f32(int rms, float *y, float *s, float *mean, float *rstd, const float *x,
                             const float *residual, int64_t R, const float *input_bias,
                             const float *weight, const float *bias, int64_t N, int64_t H,
                             double eps) noexcept nogil
cdef int fastln_add_norm_f64(int rms, double *y, double *s, double *mean, double *rstd,
                             const double *x, const double *residual, int64_t R,
                             const double *input_bias, const double *weight, const double *bias,
                             int64_t N, int64_t H, double eps) noexcept nogil
cdef int fastln_add_norm_backward_f32(int rms, float *dsum, float *dweight, float *dbias,
                                      float *dinput_bias, const float *dy, const float *s,
                                      const float *ds, const float *mean, const float *rstd,
                                      const float *weight, int64_t N, int64_t H) noexcept nogil
cdef int fastln_add_norm_backward_f64(int rms, double *dsum, double *dweight, double *dbias,
                                      double *dinput_bias, const double *dy, const double *s,
                                      const double *ds, const double *mean, const double *rstd,
                                      const double *weight, int64_t N, int64_t H) noexcept nogil
cdef int fastln_rms_norm_f32(float *y, float *rstd, const float *x, const float *weight, int64_t N,
                             int64_t H, double eps) noexcept nogil
cdef int fastln_rms_norm_f64(double *y, double *rstd, const double *x, const double *weight,
                             int64_t N, int64_t H, double eps) noexcept nogil
cdef int fastln_layer_norm_channels_f32(float *y, float *mean, float *rstd, const float *x,
                                        const float *weight, const float *bias, int64_t N,
                                        int64_t C, int64_t S, double eps) noexcept nogil
cdef int fastln_layer_norm_channels_f64(double *y, double *mean, double *rstd, const double *x,
                                        const double *weight, const double *bias, int64_t N,
                                        int64_t C, int64_t S, double eps) noexcept nogil
cdef int fastln_layer_norm_channels_backward_f32(float *dx, float *dweight, float *dbias,
                                                 const float *dy, const float *x, const float *mean,
                                                 const float *rstd, const float *weight, int64_t N,
                                                 int64_t C, int64_t S) noexcept nogil
cdef int fastln_layer_norm_channels_backward_f64(double *dx, double *dweight, double *dbias,
                                                 const double *dy, const double *x,
                                                 const double *mean, const double *rstd,
                                                 const double *weight, int64_t N, int64_t C,
                                                 int64_t S) noexcept nogil
cdef int fastln_rms_norm_channels_f32(float *y, float *rstd, const float *x, const float *weight,
                                      int64_t N, int64_t C, int64_t S, double eps) noexcept nogil
cdef int fastln_rms_norm_channels_f64(double *y, double *rstd, const double *x,
                                      const double *weight, int64_t N, int64_t C, int64_t S,
                                      double eps) noexcept nogil
cdef int fastln_rms_norm_channels_backward_f32(float *dx, float *dweight, const float *dy,
                                               const float *x, const float *rstd,
                                               const float *weight, int64_t N, int64_t C,
                                               int64_t S) noexcept nogil
cdef int fastln_rms_norm_channels_backward_f64(double *dx, double *dweight, const double *dy,
                                               const double *x, const double *rstd,
                                               const double *weight, int64_t N, int64_t C,
                                               int64_t S) noexcept nogil
cdef int fastln_rms_norm_backward_f32(float *dx, float *dweight, const float *dy, const float *x,
                                      const float *rstd, const float *weight, int64_t N,
                                      int64_t H) noexcept nogil
cdef int fastln_rms_norm_backward_f64(double *dx, double *dweight, const double *dy,
                                      const double *x, const double *rstd, const double *weight,
                                      int64_t N, int64_t H) noexcept nogil
cdef void fastln_set_num_threads(int n) noexcept nogil
cdef int fastln_get_requested_threads() noexcept nogil
cdef int fastln_get_num_threads() noexcept nogil
cdef int fastln_has_openmp() noexcept nogil
cdef const char *fastln_get_isa() noexcept nogil
cdef int fastln_set_isa(const char *name) noexcept nogil
cdef int fastln_isa_supported(const char *name) noexcept nogil
cdef int fastln_layer_norm_half(int kind, uint16_t *y, float *mean, float *rstd, const uint16_t *x,
                                const float *weight, const float *bias, int64_t N, int64_t H,
                                double eps) noexcept nogil
cdef int fastln_layer_norm_backward_half(int kind, uint16_t *dx, float *dweight, float *dbias,
                                         const uint16_t *dy, const uint16_t *x, const float *mean,
                                         const float *rstd, const float *weight, int64_t N,
                                         int64_t H) noexcept nogil
cdef int fastln_add_layer_norm_half(int kind, uint16_t *y, uint16_t *s, float *mean, float *rstd,
                                    const uint16_t *x, const uint16_t *residual,
                                    const float *weight, const float *bias, int64_t N, int64_t H,
                                    double eps) noexcept nogil
cdef int fastln_add_norm_half(int kind, int rms, uint16_t *y, uint16_t *s, float *mean, float *rstd,
                              const uint16_t *x, const uint16_t *residual, int64_t R,
                              const float *input_bias, const float *weight, const float *bias,
                              int64_t N, int64_t H, double eps) noexcept nogil
cdef int fastln_rms_norm_half(int kind, uint16_t *y, float *rstd, const uint16_t *x,
                              const float *weight, int64_t N, int64_t H, double eps) noexcept nogil
cdef int fastln_rms_norm_backward_half(int kind, uint16_t *dx, float *dweight, const uint16_t *dy,
                                       const uint16_t *x, const float *rstd, const float *weight,
                                       int64_t N, int64_t H) noexcept nogil

# the engine's entry points (src_c/api/fastln_rnn.h), as the header names them less "fastln_"
cdef int64_t rnn_packed_size(int cell, int wtype, int64_t input, int64_t hidden,
                             int64_t proj) noexcept nogil
cdef int rnn_pack(void *out, int64_t size, int cell, int wtype, int64_t input, int64_t hidden,
                  int64_t proj, const void *w_ih, const void *w_hh,
                  const void *w_hr) noexcept nogil
cdef int64_t rnn_cache_size(int cell, int64_t T, int64_t B, int64_t H) noexcept nogil
cdef int64_t rnn_work_size(int cell, int64_t T, int64_t B, int64_t H) noexcept nogil
cdef int rnn_forward_f32(const fastln_rnn_args *a) noexcept nogil
cdef int rnn_forward_f64(const fastln_rnn_args *a) noexcept nogil
cdef int rnn_backward_f32(const fastln_rnn_args *a) noexcept nogil
cdef int rnn_backward_f64(const fastln_rnn_args *a) noexcept nogil
cdef int rnn_forward2_f32(const fastln_rnn_args *a) noexcept nogil
cdef int rnn_forward2_f64(const fastln_rnn_args *a) noexcept nogil
cdef int rnn_backward2_f32(const fastln_rnn_args *a) noexcept nogil
cdef int rnn_backward2_f64(const fastln_rnn_args *a) noexcept nogil
cdef int rnn_step_f32(const fastln_rnn_step_args *s) noexcept nogil
cdef int rnn_step_f64(const fastln_rnn_step_args *s) noexcept nogil
cdef const char *rnn_bf16_products() noexcept nogil
cdef const char *rnn_int8_products() noexcept nogil
# dst (n bfloat16 bits) = src (n float32), rounded to nearest even
cdef void to_bf16(void *dst, const void *src, int64_t n) noexcept nogil
