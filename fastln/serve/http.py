"""The HTTP (JSON) endpoints of the served model, a Starlette app.

On --port (JSON bodies)::

    GET    /health                 the model, the settings, counters, cpu_seconds
    GET    /health/live            200 {"live": true} while the event loop answers
    GET    /health/ready           200 {"ready": true}, or 503 {"ready": false, "why": [...]}
                                   while the server drains or its table is full
    GET    /metrics                Prometheus's text format (fastln.serve.metrics)
    POST   /streams                {"stream": id} optional -> 201 {"stream": id, "token": T}
    POST   /streams/{id}/step      {"x": [I numbers], "token": T}
                                   -> {"y": [H numbers], "t": step index}
  admin (``Authorization: Bearer ADMIN_TOKEN`` when the server has one):
    GET    /streams                -> {"streams": {id: steps run}}
    DELETE /streams/{id}           -> {"stream": id, "steps": t}
    POST   /streams/{id}/export    -> {"stream", "t", "token", "dtype", "state"}; the
                                   stream leaves this server (its WebSocket closes with 4410)
    PUT    /streams/{id}/state     export's JSON -> 201: the stream continues here

T is the stream's resume token (fastln.serve.ws.stream): a step without it
gets 401, with another stream's 403. An admin request without the bearer
token gets 401 (with ``WWW-Authenticate: Bearer``), as does an Authorization
header of another form than ``Bearer TOKEN``; with a wrong token 403. The
token is compared in constant time.

Every refusal is a JSON object ``{"error": why}`` with its status, and counts
in ``fastln_serve_rejections_total`` under its reason (the serving guide's
table lists them); an unknown path (404) or method (405) counts as
``bad_request``. A step the engine fails answers 500, the one status no
request causes.
"""
import asyncio
import hmac
import json

import numpy as np

from .errors import RESTART, Refused
from .extra import needs_extra
from .model import input_dtype
from .service import PROBES

with needs_extra(__name__):
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from . import metrics

# the answer to an admin request without the bearer token (RFC 6750, section 3)
CHALLENGE = {"WWW-Authenticate": "Bearer"}


def bad_request(message):
    """The refusal (422) of a body that is JSON, but not of the form the endpoint takes."""
    return Refused(None, 422, message, "bad_request")


async def read_json(request, limit):
    """The request's body parsed as JSON: 413 past limit bytes, 400 if it is
    not JSON or ends before its length (the HTTP parser answers a
    Content-Length that is not a number itself)."""
    length = request.headers.get("content-length", "")
    if length.isascii() and length.isdigit() and int(length) > limit:
        raise Refused(None, 413, f"the body must be at most {limit} bytes, "
                                 f"Content-Length says {length}", "body_too_large")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise Refused(None, 413, f"the body must be at most {limit} bytes",
                              "body_too_large")
    except ClientDisconnect:
        raise Refused(None, 400, "the request ended before its body", "bad_request") from None

    def no_constants(name):
        raise ValueError(f"{name} is not a JSON number")

    try:
        return json.loads(body, parse_constant=no_constants) if body else None
    # json.JSONDecodeError and UnicodeDecodeError are ValueErrors; RecursionError: deep nesting
    except (ValueError, RecursionError) as e:
        raise Refused(None, 400, f"the body is not valid JSON: {e}", "bad_request") from None


def parse_x(payload, size, dtype):
    """x of a step request as a (size,) array of dtype; 422 with the reason if it is not one."""
    if not isinstance(payload, dict) or "x" not in payload:
        raise bad_request('the body must be a JSON object {"x": [numbers], "token": T}')
    x = payload["x"]
    if not isinstance(x, list) or len(x) != size:
        got = f"a list of {len(x)}" if isinstance(x, list) else f"a {type(x).__name__}"
        raise bad_request(f"x must be a list of {size} numbers, got {got}")
    for i, v in enumerate(x):
        if type(v) not in (int, float):   # bool, str, None, lists are not numbers here
            raise bad_request(f"x[{i}] must be a number, got {json.dumps(v)[:40]}")
    try:
        with np.errstate(over="ignore"):
            a = np.array(x, dtype)
    except OverflowError:   # an int past the float range
        raise bad_request(f"x must hold finite {dtype} numbers, "
                          f"an integer in x is too large") from None
    if not np.isfinite(a).all():
        raise bad_request(f"x must hold finite {dtype} numbers, "
                          f"x[{int(np.argmin(np.isfinite(a)))}] is not")
    return a


def bearer_check(admin_token):
    """A check of a request's ``Authorization: Bearer`` header against
    admin_token (None: every request passes), raising Refused: 401 without
    the header or with another form, 403 with another token."""
    expected = None if admin_token is None else admin_token.encode()

    def check(request):
        if expected is None:
            return
        got = request.headers.get("authorization")
        if got is None:
            raise Refused(None, 401, "this endpoint needs the admin token: "
                                     "Authorization: Bearer TOKEN", "no_admin_token", CHALLENGE)
        scheme, _, credentials = got.strip().partition(" ")
        credentials = credentials.strip()
        if scheme.lower() != "bearer" or not credentials:   # schemes ignore case (RFC 9110)
            if scheme.lower() == "bearer":
                what = "no token"
            else:
                what = f"the scheme {scheme[:20]!r}" if credentials else "no scheme"
            raise Refused(None, 401, f"the Authorization header must be 'Bearer TOKEN' (the "
                                     f"scheme Bearer, then the admin token), got {what}",
                          "no_admin_token", CHALLENGE)
        # the header's characters are its bytes (latin-1), the token's are UTF-8
        if not hmac.compare_digest(credentials.encode("latin-1", "replace"), expected):
            raise Refused(None, 403, "the admin token is wrong", "wrong_admin_token")
    return check


def error(status, message, headers=None):
    """The JSON answer {"error": message} of a refusal; ASCII, as json.dumps
    escapes what is not, so that any message encodes."""
    return Response(json.dumps({"error": message}), status, headers,
                    media_type="application/json")


def create_app(service, ports, max_body=1 << 16, admin_token=None):
    """The Starlette app of the JSON endpoints (see the module's docstring);
    the admin endpoints need admin_token when it is not None."""
    x_dtype = input_dtype(service.model)
    check_admin = bearer_check(admin_token)
    registry = metrics.registry_of(service)

    def admin(endpoint):
        async def checked(request):
            check_admin(request)
            return await endpoint(request)
        return checked

    async def scrape(request):
        return Response(metrics.exposition(registry), media_type=metrics.CONTENT_TYPE)

    def probe(check):
        async def endpoint(request):
            status, reply = check(service, ports)
            return JSONResponse(reply, status_code=status)
        return endpoint

    async def listing(request):
        return JSONResponse({"streams": {sid: s.t for sid, s in service.streams.items()
                                         if not s.leaving}})

    async def create(request):
        payload = await read_json(request, max_body)
        if payload is not None and not isinstance(payload, dict):
            raise bad_request('the body must be {"stream": id}, or empty')
        stream = service.add((payload or {}).get("stream"))
        return JSONResponse({"stream": stream.id, "token": stream.token}, status_code=201)

    async def step(request):
        payload = await read_json(request, max_body)
        x = parse_x(payload, service.model.input_size, x_dtype)
        token = payload.get("token")
        if token is not None and not isinstance(token, str):
            raise bad_request("token must be a string, the stream's resume token")
        if service.checkpointer is not None:   # a stream of another server's, from the store
            await service.checkpointer.fetch(request.path_params["stream_id"])
        stream = service.claim(request.path_params["stream_id"], token)
        if service.echo:
            raise Refused(None, 409, "an --echo server runs no model", "bad_request")
        answered = asyncio.get_running_loop().create_future()
        steps = (stream,)

        def answer(y, failure):
            service.finish(steps, failure)
            if not answered.done():    # its request may have been cancelled
                answered.set_result((y, stream.t - (failure is None), failure))
        if not service.submit(steps, x, answer):
            raise Refused(RESTART, 503, "the server restarts", "draining")
        y, t, failure = await answered
        if failure is not None:
            return error(500, f"the step failed: {failure}")
        return JSONResponse({"y": y.astype(np.float64).tolist(), "t": t})

    async def delete(request):
        stream = await service.delete(request.path_params["stream_id"])
        return JSONResponse({"stream": stream.id, "steps": stream.t})

    async def export(request):
        return JSONResponse(await service.export(request.path_params["stream_id"]))

    async def put_state(request):
        payload = await read_json(request, max(max_body, 64 * service.y_bytes
                                               * service.model.num_layers + 4096))
        stream = service.import_(request.path_params["stream_id"], payload)
        return JSONResponse({"stream": stream.id, "t": stream.t}, status_code=201)

    async def refused(request, e):
        service.refused(e.reason)
        return error(e.status, e.message, e.headers)

    async def unrouted(request, e):   # Starlette's own: no such path (404) or method (405)
        service.refused("bad_request")
        return error(e.status_code, e.detail, e.headers)

    routes = [*(Route(path, probe(check), methods=["GET"]) for path, check in PROBES.items()),
              Route("/metrics", scrape, methods=["GET"]),
              Route("/streams", admin(listing), methods=["GET"]),
              Route("/streams", create, methods=["POST"]),
              Route("/streams/{stream_id}/step", step, methods=["POST"]),
              Route("/streams/{stream_id}", admin(delete), methods=["DELETE"]),
              Route("/streams/{stream_id}/export", admin(export), methods=["POST"]),
              Route("/streams/{stream_id}/state", admin(put_state), methods=["PUT"])]
    return Starlette(routes=routes, exception_handlers={Refused: refused,
                                                        HTTPException: unrouted})
