"""A served fastln.rnn model: many client streams over WebSocket, each a
stream of a StreamTable, stepped in batches by a StreamBatcher; JSON over
HTTP for health, listing and moving streams between servers.

Start a server with ``fastln-serve --model model.npz`` (or ``python -m
fastln.serve``); ``python -m fastln.serve.model model.npz`` writes a new
LN-LSTM to serve, and ``python -m fastln.serve.loadtest`` measures one. It
needs the ``serve`` extra: ``pip install "fastln[serve]"``.

The modules, one concept each:

- :mod:`fastln.serve.errors`: stream ids, close codes and HTTP statuses;
- :mod:`fastln.serve.service`: the streams, their table and batcher;
- :mod:`fastln.serve.protocol`: the WebSocket protocol (a connection per stream);
- :mod:`fastln.serve.admin`: the HTTP endpoints;
- :mod:`fastln.serve.client`: :class:`StreamClient`, and helpers to start a
  server and move a stream;
- :mod:`fastln.serve.cluster`: moving streams when servers come and go behind a
  proxy (``rebalance``, ``drain``);
- :mod:`fastln.serve.model`: model files and the single-stream reference run;
- :mod:`fastln.serve.loadtest`: the load generator;
- :mod:`fastln.serve.cli`: the command line.

The names below import their module on first use, so that ``import
fastln.serve`` loads none of the extra's packages; without them, using one,
or importing a module that needs them (``from fastln.serve.client import
StreamClient``), raises an ImportError that names the package and the extra.
"""
import contextlib
import importlib
import sys
from typing import TYPE_CHECKING

from .._optional import EXTRAS, missing

if TYPE_CHECKING:   # the names __getattr__ gives, for type checkers
    from .client import (
        Closed,
        FrameRefused,
        MoveError,
        MuxClient,
        MuxStream,
        Server,
        StreamClient,
        move_stream,
        run_server,
    )
    from .cluster import drain, rebalance
    from .model import load_model, save_model
    from .service import Service

_EXPORTS = {**dict.fromkeys(["StreamClient", "MuxClient", "MuxStream", "Closed", "FrameRefused",
                             "move_stream", "MoveError", "run_server", "Server"], "client"),
            "rebalance": "cluster", "drain": "cluster", "Service": "service",
            "save_model": "model", "load_model": "model"}

__all__ = ["Closed", "FrameRefused", "MoveError", "MuxClient", "MuxStream", "Server", "Service",
           "StreamClient", "drain", "load_model", "move_stream", "rebalance", "run_server",
           "save_model"]


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


def _load(module):
    """fastln.serve.<module>, or the ImportError of fastln._optional.missing
    when a package of the serve extra is not installed."""
    with needs_extra("fastln.serve"):
        return importlib.import_module(f"{__name__}.{module}")


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fastln.serve' has no attribute {name!r}")
    return getattr(_load(module), name)


def main(argv=None):
    """The command line of fastln-serve (fastln.serve.cli.main); without the
    serve extra's packages, exits with the message that names them."""
    try:
        cli = _load("cli")
    except ImportError as e:
        if EXTRAS.get(e.name) == "serve":
            sys.exit(f"fastln-serve: {e}")
        raise
    return cli.main(argv)


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
