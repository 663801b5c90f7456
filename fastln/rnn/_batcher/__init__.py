"""StreamBatcher, which gathers the single steps of a StreamTable's streams,
arriving one request at a time, into batched table steps, for asyncio
servers.

Its parts, each free of the one above: ``stats.py`` counts (metrics),
``batch.py`` is one batch (gather, run, answer), ``queues.py`` the waiting
steps and which of them a batch takes, and ``front.py`` the asyncio face
(StreamBatcher: its methods, the worker task and thread). Only ``front.py``
touches the event loop. The package may import fastln.rnn's ``_streams``
(the table and its errors), ``_inputs`` and ``_bf16``, and fastln's
``_validate`` and ``_torch``; nothing in fastln.rnn imports it but the package's
``__init__``.
"""
from .front import StreamBatcher
from .queues import OverloadedError

__all__ = ["StreamBatcher", "OverloadedError"]
