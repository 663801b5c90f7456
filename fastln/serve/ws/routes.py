"""The routes of --ws-port: /ws/ID to a connection of one stream
(ws.stream), /mux to a multiplexed one (ws.mux), the health probes, and
GET /owner/ID (this server's addresses: asked through a proxy that routes by
the stream id, those of the server that owns ID).
"""
import json
from urllib.parse import parse_qs

import numpy as np

from ..errors import POLICY, Refused, check_stream_id
from ..extra import needs_extra
from ..frames import MUX_PATH, STREAM_PATH
from ..service import PROBES, check_received

with needs_extra(__name__):
    from picows import WSUpgradeResponse, WSUpgradeResponseWithListener

    from . import mux, stream


def _json(status, reply):
    """An upgrade request's plain HTTP answer: status and the JSON reply."""
    body, headers = json.dumps(reply).encode(), {"Content-Type": "application/json"}
    if status == 200:
        response = WSUpgradeResponse.create_ok_response(body, headers)
    else:
        response = WSUpgradeResponse.create_error_response(status, body, headers)
    return WSUpgradeResponseWithListener(response, None)


def _x_dtype(service, query, refusal=None):
    """(x's dtype, refusal) of a query's ``dtype=`` (the service's first x
    dtype by default): the refusal of a dtype the model does not take, or
    the one given."""
    name = query.get("dtype", [next(iter(service.x_dtypes))])[-1]
    if name in service.x_dtypes:
        return service.x_dtypes[name], refusal
    return np.float32, Refused(POLICY, 422, f"dtype must be one of "
                                            f"{', '.join(service.x_dtypes)}, got {name[:20]!r}")


def ws_factory(service, ports, address):
    """picows's listener factory of --ws-port (see the module's docstring);
    ports are (ws_port, port), address the one /owner/ID names."""
    owner = {"http": f"http://{address}:{ports[1]}", "ws": f"ws://{address}:{ports[0]}"}

    def factory(request):
        path, _, query = request.path.decode("latin-1").partition("?")
        # parse_qs decodes %-escapes that are not UTF-8 as U+FFFD: every value is a clean str
        q = parse_qs(query)
        if path == MUX_PATH:
            return mux.Connection(service, *_x_dtype(service, q))
        if path in PROBES:
            return _json(*PROBES[path](service, ports))
        if path.startswith("/owner/"):
            return _json(200, owner)
        if not path.startswith(STREAM_PATH):
            service.refused("bad_request")
            return None            # 404
        stream_id, refusal = path[len(STREAM_PATH):], None
        try:
            check_stream_id(stream_id)
        except Refused as e:
            refusal = e
        x_dtype, refusal = _x_dtype(service, q, refusal)
        new = q.get("new", ["0"])[-1]
        if new not in ("0", "1"):
            refusal = Refused(POLICY, 422, f"new must be 0 or 1, got {new[:20]!r}")
        token = q.get("token", [None])[-1]
        received = q.get("received", [None])[-1]
        if received is not None:
            digits = received.isascii() and received.isdigit() and len(received) <= 19
            try:
                received = check_received(int(received) if digits else received, new == "1")
            except Refused as e:
                refusal, received = e, None
        return stream.Connection(service, stream_id, new == "1", x_dtype, refusal, token,
                                 received)
    return factory
