"""A served fastln.rnn model: many client streams over WebSocket, each a
stream of a StreamTable, stepped in batches by a StreamBatcher; JSON over
HTTP for health, listing and moving streams between servers.

Start a server with ``fastln-serve --model model.npz`` (or ``python -m
fastln.serve``); ``python -m fastln.serve.model model.npz`` writes a new
LN-LSTM to serve, and ``python -m fastln.serve.loadtest`` measures one. It
needs the ``serve`` extra: ``pip install "fastln[serve]"``.

The modules, one concept each:

- :mod:`fastln.serve.errors`: stream ids, close codes and HTTP statuses;
- :mod:`fastln.serve.model`: model files and the single-stream reference run;
- :mod:`fastln.serve.service`: the streams, their table and batcher, and what
  both listeners share: a step's bookkeeping, a stream's leaving, the
  health probes;
- :mod:`fastln.serve.frames`: the paths and the multiplexed frame's layout,
  which the server and the clients both write;
- :mod:`fastln.serve.ws`: the WebSocket listener: the protocol of a
  connection per stream (``ws.stream``), the multiplexed one (``ws.mux``),
  what their connections share, and the routes;
- :mod:`fastln.serve.http`: the HTTP endpoints;
- :mod:`fastln.serve.metrics`: the Prometheus metrics;
- :mod:`fastln.serve.checkpoint`: the checkpoints of the streams, so that a
  server killed loses none, and their takeover by another server;
- :mod:`fastln.serve.store`: where checkpoints live: a directory, or Redis
  shared by the servers behind a proxy;
- :mod:`fastln.serve.cli`: the command line, which runs the server;
- :mod:`fastln.serve.loop`: the event loop (uvloop where installed);
- :mod:`fastln.serve.extra`: the error that names a missing package of the
  serve extra;
- :mod:`fastln.serve.client`: :class:`StreamClient`, :class:`MuxClient`, and
  helpers to start a server and move a stream;
- :mod:`fastln.serve.cluster`: moving streams when servers come and go behind a
  proxy (``rebalance``, ``drain``);
- :mod:`fastln.serve.loadtest`: the load generator, which drives a server
  through the client's wire (and a cluster behind nginx, one of whose
  servers it kills).

What each may import: the server's modules (service, ws, http, metrics,
checkpoint, store, cli) import nothing of the clients, and the clients (client, cluster)
nothing of the server; what both ends write alike is in frames. The load
generator imports the clients, never the server, which it starts as a
command. errors, frames, model, loop and extra import no other module of
fastln.serve; this face imports extra, and the rest only when a name of
theirs is first asked for.

The names below import their module on first use, so that ``import
fastln.serve`` loads none of the extra's packages; without them, using one,
or importing a module that needs them (``from fastln.serve.client import
StreamClient``), raises an ImportError that names the package and the extra.
"""
import importlib
import sys
from typing import TYPE_CHECKING

from .._optional import EXTRAS
from .extra import needs_extra

if TYPE_CHECKING:   # the names __getattr__ gives, for type checkers
    from .client import (
        Closed,
        FrameRefused,
        MoveError,
        MuxClient,
        MuxStream,
        ReplayError,
        Server,
        StreamClient,
        move_stream,
        run_server,
    )
    from .cluster import drain, rebalance
    from .model import load_model, save_model
    from .service import Service

_EXPORTS = {**dict.fromkeys(["StreamClient", "MuxClient", "MuxStream", "Closed", "FrameRefused",
                             "ReplayError", "move_stream", "MoveError", "run_server", "Server"],
                            "client"),
            "rebalance": "cluster", "drain": "cluster", "Service": "service",
            "save_model": "model", "load_model": "model"}

__all__ = ["Closed", "FrameRefused", "MoveError", "MuxClient", "MuxStream", "ReplayError", "Server",
           "Service", "StreamClient", "drain", "load_model", "move_stream", "rebalance",
           "run_server", "save_model"]


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
