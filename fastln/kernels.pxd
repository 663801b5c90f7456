# fastln's kernels for Cython code: the functions of the C header fastln.h,
# under the same names, with the same arguments, results and error codes,
# callable without the GIL.
#
#     # cython: language_level=3
#     cimport fastln.kernels as fk
#
#     with nogil:
#         rc = fk.fastln_layer_norm_f32(&y[0, 0], NULL, NULL, &x[0, 0],
#                                       NULL, NULL, n, h, 1e-5)
#
# The extension compiles with fastln.get_include() among its include
# directories (fastln.h is there) and links nothing of fastln's: the functions
# are those compiled into fastln._lib, which Cython imports when the
# extension is imported and whose function pointers it looks up then. The
# extension thus shares fastln's state (the thread count that
# fastln.set_num_threads and fastln_set_num_threads set, the instruction-set
# path, the cache of large outputs) instead of loading a copy of its own.
# fastln.h (in fastln.get_include()) documents every function.
from fastln._lib cimport (
    FASTLN_BF16, FASTLN_EINVAL, FASTLN_ENOMEM, FASTLN_F16, FASTLN_OK,
    fastln_add_layer_norm_f32, fastln_add_layer_norm_f64, fastln_add_layer_norm_half,
    fastln_add_norm_backward_f32, fastln_add_norm_backward_f64, fastln_add_norm_f32,
    fastln_add_norm_f64, fastln_add_norm_half, fastln_get_isa, fastln_get_num_threads,
    fastln_get_requested_threads, fastln_has_openmp, fastln_isa_supported,
    fastln_layer_norm_backward_f32, fastln_layer_norm_backward_f64, fastln_layer_norm_backward_half,
    fastln_layer_norm_channels_backward_f32, fastln_layer_norm_channels_backward_f64,
    fastln_layer_norm_channels_f32, fastln_layer_norm_channels_f64, fastln_layer_norm_f32,
    fastln_layer_norm_f64, fastln_layer_norm_half, fastln_rms_norm_backward_f32,
    fastln_rms_norm_backward_f64, fastln_rms_norm_backward_half,
    fastln_rms_norm_channels_backward_f32, fastln_rms_norm_channels_backward_f64,
    fastln_rms_norm_channels_f32, fastln_rms_norm_channels_f64, fastln_rms_norm_f32,
    fastln_rms_norm_f64, fastln_rms_norm_half, fastln_set_isa, fastln_set_num_threads)
