"""Thread-count control for fastln's OpenMP kernels.

:func:`get_num_threads`, :func:`set_num_threads` and the context manager
:func:`threads` (all re-exported by :mod:`fastln`) read and set one
process-wide count of threads for the kernels' parallel loops over rows.
Without a count set, the default is the machine's: the smaller of the CPUs
in the process's affinity mask and its control groups' CPU quota rounded up
(a container limited to 1.5 CPUs on a 64-CPU host: 2), unless
``OMP_NUM_THREADS`` is set, or a limit such as threadpoolctl's changes
OpenMP's count; those win. A build without OpenMP
(:func:`fastln.has_openmp`) runs every call on one thread.
"""
from __future__ import annotations

import contextlib
import numbers
import os
from collections.abc import Iterator, Mapping
from typing import Optional

import numpy as np

from fastln import _cgroup, _lib, _wait

MAX_THREADS = 4096   # more would only ask OpenMP for an absurd thread pool


def default_threads(environ: Mapping[str, str] = os.environ, root: str = "/",
                    cpus: Optional[int] = None) -> int:
    """The default thread count of the machine, 0 for OpenMP's own.

    0 where environ sets ``OMP_NUM_THREADS`` (OpenMP's count is the user's
    choice), else the smaller of cpus (default: the affinity mask's CPU count)
    and the CPU quota of the control groups under the filesystem root,
    rounded up (:func:`fastln._cgroup.default_threads`).
    """
    if environ.get("OMP_NUM_THREADS"):
        return 0
    return _cgroup.default_threads(root, cpus)


def get_num_threads() -> int:
    """The number of threads a large fastln call uses now.

    It is the count given to :func:`set_num_threads`, else the default: the
    smaller of the CPUs in the process's affinity mask and its control
    groups' CPU quota rounded up (cgroup v2 ``cpu.max``, v1
    ``cpu.cfs_quota_us``), read at import; where ``OMP_NUM_THREADS`` is set,
    OpenMP's count instead. A limit set later on the calling thread, such as
    threadpoolctl's ``threadpool_limits(1, "openmp")`` (or
    ``torch.set_num_threads`` where torch shares fastln's libgomp), caps
    either. Small calls run on one thread whatever this says.

    Returns
    -------
    int
        At least 1.

    Examples
    --------
    >>> import fastln
    >>> fastln.get_num_threads() >= 1
    True
    """
    return _lib.get_num_threads()


def set_num_threads(n: Optional[int]) -> None:
    """Use ``n`` threads in later calls; ``n=None`` returns to the default.

    Parameters
    ----------
    n : int or None
        The thread count, 1 to 4096 (``MAX_THREADS``), or None for the
        default (see :func:`get_num_threads`: the affinity mask's CPUs capped
        by the cgroup CPU quota, or ``OMP_NUM_THREADS``). The setting is
        process-wide: it applies to calls from every Python thread.

    Raises
    ------
    TypeError
        n is neither an int nor None (a bool is refused too).
    ValueError
        n is outside 1..4096.

    See Also
    --------
    threads : the same for the duration of a ``with`` block.

    Examples
    --------
    >>> import fastln
    >>> fastln.set_num_threads(1)
    >>> fastln.get_num_threads()
    1
    >>> fastln.set_num_threads(None)    # back to the default
    """
    if n is None:
        _lib.set_num_threads(0)
        return
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, numbers.Integral):
        raise TypeError(f"n must be an int or None, got {type(n).__name__}")
    if not 1 <= n <= MAX_THREADS:
        raise ValueError(f"n must be between 1 and {MAX_THREADS}, got {n}")
    _lib.set_num_threads(int(n))


@contextlib.contextmanager
def threads(n: Optional[int]) -> Iterator[None]:
    """Context manager: run fastln on ``n`` threads inside the block, then restore.

    On exit (also by an exception) the count requested before is restored,
    or the default where none was. The setting is process-wide, like
    :func:`set_num_threads`: other Python threads see it during the block.

    Parameters
    ----------
    n : int or None
        As for :func:`set_num_threads`.

    Returns
    -------
    context manager
        Entering it sets the count (and yields None).

    Raises
    ------
    TypeError, ValueError
        As :func:`set_num_threads`, when the block is entered.

    Examples
    --------
    >>> import numpy as np, fastln
    >>> with fastln.threads(1):
    ...     y = fastln.layer_norm(np.ones((4, 8)))
    ...     fastln.get_num_threads()
    1
    """
    previous = _lib.get_requested_threads()
    set_num_threads(n)
    try:
        yield
    finally:
        _lib.set_num_threads(previous)


def get_wait_policy() -> str:
    """How fastln's idle OpenMP threads wait between calls, as one line of text.

    OpenMP's worker threads spin on the CPU for a while after a call, then
    sleep. Where the environment sets neither ``OMP_WAIT_POLICY`` nor the
    runtime's own variable (``GOMP_SPINCOUNT`` for GCC's libgomp,
    ``KMP_BLOCKTIME`` for LLVM's libomp) when fastln is imported, fastln gives
    the runtime a short spin (0.01-0.15 ms, with the CPU): enough for
    calls made back to back, short enough that a process calling fastln now
    and then does not keep cores busy. This is fixed when the runtime starts:
    set the variables before starting Python (``OMP_WAIT_POLICY=passive``:
    sleep at once; ``GOMP_SPINCOUNT=300000``: libgomp's own default spin), or
    import fastln before libraries that load the same runtime (torch).

    Returns
    -------
    str
        ``"short spin (GOMP_SPINCOUNT=3000, fastln's default)"``; or
        ``"the environment's (OMP_WAIT_POLICY=passive)"`` (the variables
        set); or ``"libgomp.so.1's default (loaded before fastln)"`` where
        another library loaded the runtime first, without the variables;
        or ``"serial build (no OpenMP threads)"``.

    Examples
    --------
    >>> import fastln
    >>> isinstance(fastln.get_wait_policy(), str)
    True
    """
    return _wait.describe()


_lib._set_default_threads(default_threads())
