"""fastln: fast Layer Normalization and RMSNorm for CPUs.

C kernels with OpenMP and run-time instruction-set dispatch, behind a NumPy
API. See README.md for a tour; ``python -m fastln`` runs a self-check and a
benchmark against the peers installed.

Functions: :func:`layer_norm`, :func:`layer_norm_backward`,
:func:`rms_norm`, :func:`rms_norm_backward` (from :mod:`fastln._norms`), and
the fused residual ops :func:`add_layer_norm`, :func:`add_rms_norm` and their
backward (from :mod:`fastln._add_norms`). Layers: :class:`LayerNorm` and :class:`RMSNorm` (from
:mod:`fastln.layers`). Threads: :func:`get_num_threads`,
:func:`set_num_threads`, :func:`threads` and :func:`get_wait_policy`. Instruction sets:
:func:`get_isa`, :func:`supported_isas`; :func:`has_openmp`. The cache of
large outputs: :func:`cache_info`, :func:`set_cache_limit` and
:func:`empty_cache` (from :mod:`fastln._memory`).

Submodules: recurrent networks in :mod:`fastln.rnn`, dask arrays in
:mod:`fastln.dask`, float64 references in :mod:`fastln.reference` and
:mod:`fastln.rnn_reference`. ``import fastln`` does not import them (nor dask):
each loads on first use, so ``fastln.rnn.LNLSTM`` works after a plain
``import fastln``.

Torch tensors: the functions and layers take a CPU tensor that does not
require grad wherever they take an array (read without a copy where its dtype
allows), and return NumPy arrays; fastln has no autograd. A tensor that
requires grad raises a TypeError naming the argument: pass ``x.detach()``.

The environment variable ``FASTLN_ISA`` ("avx512", "avx2" or "generic", in
any case) forces an instruction-set path; one this CPU cannot run is
ignored, with a RuntimeWarning at import.

Notes
-----
The private modules of the top level: the public functions are Cython
(``_norms``, ``_add_norms``) over the kernels on canonical arrays (``_rows``)
and the C core (``_lib``, the one extension that compiles the C kernels and
holds their state); what a fast path does not take goes to the general path
(``_general``, over ``_layout``). The argument checks (``_validate``) and
the 16-bit dtypes (``_dtypes``) serve the whole package. Imports point one
way, from the public functions down to ``_lib``: the general path never
imports the Cython modules that call it. :mod:`fastln.rnn` and
:mod:`fastln.serve` may import the top level's shared modules (``_lib``,
``_validate``, ``_dtypes``, ``_torch``, ``_optional``); of the top level, only
``dask``, ``_selfcheck`` and ``__main__`` import :mod:`fastln.rnn`.

Examples
--------
>>> import numpy as np, fastln
>>> x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
>>> y = fastln.layer_norm(x)
>>> y.dtype, bool(np.allclose(y.mean(axis=-1), 0, atol=1e-6))
(dtype('float32'), True)
"""
import importlib as _importlib
import os as _os
import typing as _typing
import warnings as _warnings
from types import ModuleType as _ModuleType

from fastln import _wait

# fastln._lib first, through _wait: importing it loads the OpenMP runtime, which
# reads its waiting policy from the environment as it starts (see fastln._wait)
_wait.import_lib()

from fastln import _lib  # noqa: E402
from fastln._add_norms import (  # noqa: E402
    add_layer_norm,
    add_layer_norm_backward,
    add_rms_norm,
    add_rms_norm_backward,
)
from fastln._lib import get_isa, has_openmp  # noqa: E402
from fastln._memory import cache_info, empty_cache, set_cache_limit  # noqa: E402
from fastln._norms import (  # noqa: E402
    layer_norm,
    layer_norm_backward,
    rms_norm,
    rms_norm_backward,
)
from fastln._threads import (  # noqa: E402
    get_num_threads,
    get_wait_policy,
    set_num_threads,
    threads,
)
from fastln.layers import LayerNorm, RMSNorm  # noqa: E402

if _typing.TYPE_CHECKING:   # for type checkers: at run time these load on first use
    from fastln import dask as dask
    from fastln import reference as reference
    from fastln import rnn as rnn
    from fastln import rnn_reference as rnn_reference

#: The version of fastln, as in pyproject.toml.
__version__: str = "0.1.0"

__all__ = [
    "layer_norm", "layer_norm_backward", "rms_norm", "rms_norm_backward", "add_layer_norm",
    "add_layer_norm_backward", "add_rms_norm", "add_rms_norm_backward",
    "LayerNorm", "RMSNorm", "get_num_threads", "set_num_threads", "threads", "get_wait_policy",
    "get_isa", "supported_isas", "has_openmp", "cache_info", "set_cache_limit", "empty_cache",
    "get_include", "__version__",
]

ISAS = ("avx512", "avx2", "generic")

# the public submodules that ``import fastln`` leaves unloaded (fastln.dask
# needs dask); module-level __getattr__ (PEP 562) imports one when first named
_LAZY_SUBMODULES = frozenset({"dask", "reference", "rnn", "rnn_reference"})


if not _typing.TYPE_CHECKING:   # type checkers see the imports above, and no other names
    def __getattr__(name: str) -> _ModuleType:
        if name in _LAZY_SUBMODULES:
            return _importlib.import_module(f"{__name__}.{name}")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(globals()) | _LAZY_SUBMODULES)


def supported_isas() -> list[str]:
    """The instruction-set paths this CPU can run, fastest first.

    Returns
    -------
    list of str
        A subset of ``["avx512", "avx2", "generic"]``, in that order;
        "generic" runs everywhere. :func:`get_isa` is the one in use.

    Examples
    --------
    >>> import fastln
    >>> fastln.supported_isas()[-1]
    'generic'
    """
    return [name for name in ISAS if _lib.isa_supported(name)]


def get_include() -> str:
    """The directory of fastln's C headers, for building extensions that call
    its kernels from Cython or C.

    It holds ``fastln.h`` (the normalization kernels, threads and
    instruction-set paths) and ``fastln_rnn.h`` (the recurrent engine). A
    Cython extension that does ``cimport fastln.kernels`` compiles with this
    directory among its include directories, as one that cimports numpy does
    with :func:`numpy.get_include`. It links no library of fastln's: the
    functions it calls are those of the loaded fastln, so both share one
    thread count, instruction-set path and cache of large outputs.

    Returns
    -------
    str
        An absolute path: the ``include`` folder of the fastln package.

    Examples
    --------
    >>> import os
    >>> import fastln
    >>> sorted(f for f in os.listdir(fastln.get_include()) if f.endswith(".h"))
    ['fastln.h', 'fastln_rnn.h']

    In a ``setup.py``::

        Extension("mymodule", ["mymodule.pyx"], include_dirs=[fastln.get_include()])
    """
    return _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "include")


# The names are case-insensitive and white space around them is ignored, as
# in the C core's reading of FASTLN_ISA (src_c/paths/select.c).
_env_isa = _os.environ.get("FASTLN_ISA")
_env_isa_key = (_env_isa or "").strip(" \t\n\v\f\r").lower()
if _env_isa_key and _env_isa_key != get_isa():
    _warnings.warn(f"FASTLN_ISA={_env_isa!r} is unknown or not supported on this CPU "
                   f"(choices: {', '.join(supported_isas())}); using {get_isa()!r}",
                   RuntimeWarning, stacklevel=2)
