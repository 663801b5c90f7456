"""The packages of the serve extra: each module of fastln.serve imports them
under :func:`needs_extra`, so that one not installed is named with the
extra that installs it."""
import contextlib

from .._optional import EXTRAS, missing


@contextlib.contextmanager
def needs_extra(feature):
    """Makes the ImportError of a package of the serve extra that is not
    installed, imported within, the one of fastln._optional.missing, which
    names the package and the extra; each module of fastln.serve imports
    the extra's packages under it."""
    try:
        yield
    except ImportError as e:
        package = (e.name or "").split(".")[0]
        if EXTRAS.get(package) == "serve":
            raise missing(package, feature) from None
        raise
