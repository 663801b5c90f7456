"""The load generator of the served model: ``python -m fastln.serve.loadtest``
starts fastln-serve in subprocesses and drives it through the client's wire,
checking every reply bit for bit (:mod:`fastln.serve.loadtest.cli` describes
the runs and the options).

The modules: ``clients`` (the load generator's streams, on the client's
Peer), ``drive`` (one run against a server, and the restart), ``runs`` (the
runs of one model dtype), ``report`` (the table, RESULTS.md and the plot),
``cli`` (the command line). They import fastln.serve's client, model,
errors, frames, loop and extra: nothing of the server, which they start as
a command.
"""
from .cli import main, make_parser

__all__ = ["main", "make_parser"]
