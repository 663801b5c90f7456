"""fastln: fast Layer Normalization and RMSNorm for CPUs.

C kernels with OpenMP and run-time instruction-set dispatch, behind a NumPy
API. See README.md for a tour; ``python -m fastln`` runs a self-check and a
benchmark against the peers installed.
"""
import os as _os
import warnings as _warnings

from fastln._core import (add_layer_norm, get_isa, has_openmp, layer_norm,
                          layer_norm_backward, rms_norm, rms_norm_backward)
from fastln._threads import get_num_threads, set_num_threads, threads
from fastln.layers import LayerNorm, RMSNorm
from fastln import _core

__version__ = "0.1.0"

__all__ = [
    "layer_norm", "layer_norm_backward", "rms_norm", "rms_norm_backward", "add_layer_norm",
    "LayerNorm", "RMSNorm", "get_num_threads", "set_num_threads", "threads",
    "get_isa", "supported_isas", "has_openmp", "__version__",
]

ISAS = ("avx512", "avx2", "generic")


def supported_isas():
    """The instruction-set paths this CPU can run, fastest first."""
    return [name for name in ISAS if _core.isa_supported(name)]


_env_isa = _os.environ.get("FASTLN_ISA")
if _env_isa and _env_isa != get_isa():
    _warnings.warn(f"FASTLN_ISA={_env_isa!r} is unknown or not supported on this CPU "
                   f"(choices: {', '.join(supported_isas())}); using {get_isa()!r}",
                   RuntimeWarning, stacklevel=2)
