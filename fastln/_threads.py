"""Thread-count control for fastln's OpenMP kernels.

:func:`get_num_threads`, :func:`set_num_threads` and the context manager
:func:`threads` (all re-exported by :mod:`fastln`) read and set one
process-wide count of threads for the kernels' parallel loops over rows.
Without a count set, OpenMP's default applies (``OMP_NUM_THREADS``, or the
number of CPUs). A build without OpenMP (:func:`fastln.has_openmp`) runs
every call on one thread.
"""
import contextlib
import numbers

import numpy as np

from fastln import _core

MAX_THREADS = 4096   # more would only ask OpenMP for an absurd thread pool


def get_num_threads():
    """The number of threads a large fastln call uses now.

    It is the count given to :func:`set_num_threads`, else OpenMP's default
    (``OMP_NUM_THREADS``, or the number of CPUs). A limit set later on the
    calling thread, such as threadpoolctl's ``threadpool_limits(1, "openmp")``
    (or ``torch.set_num_threads`` where torch shares fastln's libgomp), caps
    it. Small calls run on one thread whatever this says.

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
    return _core.get_num_threads()


def set_num_threads(n):
    """Use ``n`` threads in later calls; ``n=None`` returns to the OpenMP default.

    Parameters
    ----------
    n : int or None
        The thread count, 1 to 4096 (``MAX_THREADS``), or None for OpenMP's
        default. The setting is process-wide: it applies to calls from every
        Python thread.

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
    >>> fastln.set_num_threads(None)    # back to OpenMP's default
    """
    if n is None:
        _core.set_num_threads(0)
        return
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, numbers.Integral):
        raise TypeError(f"n must be an int or None, got {type(n).__name__}")
    if not 1 <= n <= MAX_THREADS:
        raise ValueError(f"n must be between 1 and {MAX_THREADS}, got {n}")
    _core.set_num_threads(int(n))


@contextlib.contextmanager
def threads(n):
    """Context manager: run fastln on ``n`` threads inside the block, then restore.

    On exit (also by an exception) the count requested before is restored,
    or OpenMP's default where none was. The setting is process-wide, like
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
    previous = _core.get_requested_threads()
    set_num_threads(n)
    try:
        yield
    finally:
        _core.set_num_threads(previous)
