"""What both ends of the served model's WebSocket protocols write alike: the
paths of the two protocols on --ws-port, and the layout of a multiplexed
frame (fastln.serve.ws.mux's docstring describes it). The server
(fastln.serve.ws) and the clients (fastln.serve.client) import it; it
imports NumPy alone.
"""
import numpy as np

STREAM_PATH = "/ws/"   # + the stream id: the protocol of a connection per stream
MUX_PATH = "/mux"      # the multiplexed protocol


def header_bytes(n):
    """Bytes of a frame's header for n steps: n and the n indices, uint32
    each, padded to a multiple of 8."""
    return (4 * (n + 1) + 7) // 8 * 8


def frame_bytes(n, x_bytes):
    """Bytes of a frame of n steps whose x rows are x_bytes each."""
    return header_bytes(n) + n * x_bytes


def encode(indices, x):
    """One frame: the indices (n) and x (n rows) as the protocol's bytes."""
    indices = np.asarray(indices, "<u4")
    n = len(indices)
    head = np.zeros(header_bytes(n) // 4, "<u4")
    head[0] = n
    head[1:n + 1] = indices
    return head.tobytes() + np.ascontiguousarray(x).tobytes()
