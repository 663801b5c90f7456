"""The WebSocket side of the served model, on --ws-port: the protocol of a
connection per stream (:mod:`fastln.serve.ws.stream`), the multiplexed one
(:mod:`fastln.serve.ws.mux`), what their connections share
(``ws.connection``), and the routes (``ws.routes``, the listener factory
that fastln.serve.cli starts picows with).

Its modules import picows, and of fastln.serve the service, errors, frames
and extra; nothing of the HTTP side, the command line or the clients.
"""
