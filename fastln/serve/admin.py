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

T is the stream's resume token (fastln.serve.protocol): a step without it
gets 401, with another stream's 403. An admin request without the bearer
token gets 401 (with ``WWW-Authenticate: Bearer``), with a wrong one 403;
the token is compared in constant time.
"""
import asyncio
import hmac
import json

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from . import metrics
from .errors import GONE, RESTART, STREAM_ID, UNSUPPORTED, Refused
from .model import input_dtype
from .protocol import PROBES


async def read_json(request, limit):
    """The request's body parsed as JSON: 413 past limit bytes, 400 if it is not JSON."""
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > limit):
        raise HTTPException(413, f"the body must be at most {limit} bytes, "
                                 f"Content-Length says {length}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise HTTPException(413, f"the body must be at most {limit} bytes")

    def no_constants(name):
        raise ValueError(f"{name} is not a JSON number")

    try:
        return json.loads(body, parse_constant=no_constants) if body else None
    except ValueError as e:   # json.JSONDecodeError and UnicodeDecodeError included
        raise HTTPException(400, f"the body is not valid JSON: {e}") from None


def parse_x(payload, size, dtype):
    """x of a step request as a (size,) array of dtype; 422 with the reason if it is not one."""
    if not isinstance(payload, dict) or "x" not in payload:
        raise HTTPException(422, 'the body must be a JSON object {"x": [numbers]}')
    x = payload["x"]
    if not isinstance(x, list) or len(x) != size:
        got = f"a list of {len(x)}" if isinstance(x, list) else f"a {type(x).__name__}"
        raise HTTPException(422, f"x must be a list of {size} numbers, got {got}")
    for i, v in enumerate(x):
        if type(v) not in (int, float):   # bool, str, None, lists are not numbers here
            raise HTTPException(422, f"x[{i}] must be a number, got {json.dumps(v)}")
    try:
        with np.errstate(over="ignore"):
            a = np.array(x, dtype)
    except OverflowError:   # an int past the float range
        raise HTTPException(422, f"x must hold finite {dtype} numbers, "
                                 f"an integer in x is too large") from None
    if not np.isfinite(a).all():
        raise HTTPException(422, f"x must hold finite {dtype} numbers, "
                                 f"x[{int(np.argmin(np.isfinite(a)))}] is not")
    return a


def bearer_check(admin_token):
    """A check of a request's ``Authorization: Bearer`` header against
    admin_token (None: every request passes), raising HTTPException 401 or 403."""
    expected = None if admin_token is None else f"Bearer {admin_token}".encode()

    def check(request):
        if expected is None:
            return
        got = request.headers.get("authorization")
        if got is None:
            raise HTTPException(401, "this endpoint needs the admin token: "
                                     "Authorization: Bearer TOKEN",
                                headers={"WWW-Authenticate": "Bearer"})
        if not hmac.compare_digest(got.encode("latin-1", "replace"), expected):
            raise HTTPException(403, "the admin token is wrong")
    return check


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

    def refused(e):
        service.refused(e.reason)
        return JSONResponse({"error": e.message}, status_code=e.status)

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
        stream_id = None
        if payload is not None:
            stream_id = payload.get("stream") if isinstance(payload, dict) else None
            if not isinstance(stream_id, str) or not STREAM_ID.fullmatch(stream_id):
                raise HTTPException(422, 'the body must be {"stream": id}, an id of 1 to 64 '
                                         "letters, digits, '_', '.' or '-', or empty")
        try:
            stream = service.add(stream_id)
        except Refused as e:
            return refused(e)
        return JSONResponse({"stream": stream.id, "token": stream.token}, status_code=201)

    async def step(request):
        payload = await read_json(request, max_body)
        x = parse_x(payload, service.model.input_size, x_dtype)
        token = payload.get("token")
        if token is not None and not isinstance(token, str):
            raise HTTPException(422, "token must be a string, the stream's resume token")
        try:
            stream = service.claim(request.path_params["stream_id"], token)
            if service.echo:
                raise Refused(UNSUPPORTED, 409, "an --echo server runs no model")
            answered = asyncio.get_running_loop().create_future()

            def answer(y, error):
                t = service.finish(stream, error)
                if not answered.done():    # its request may have been cancelled
                    answered.set_result((y, t, error))
            if not service.submit(stream, x, answer):
                raise Refused(RESTART, 503, "the server restarts")
        except Refused as e:
            return refused(e)
        y, t, error = await answered
        if error is not None:
            return JSONResponse({"error": f"the step failed: {error}"}, 500)
        return JSONResponse({"y": y.astype(np.float64).tolist(), "t": t})

    async def delete(request):
        try:
            stream = service.get(request.path_params["stream_id"])
        except Refused as e:
            return refused(e)
        stream.leaving = True
        await service.quiet(stream)
        if stream.conn is not None:
            stream.conn.close(GONE, "the stream was deleted")
        service.remove(stream)
        return JSONResponse({"stream": stream.id, "steps": stream.t})

    async def export(request):
        try:
            return JSONResponse(await service.export(request.path_params["stream_id"]))
        except Refused as e:
            return refused(e)

    async def put_state(request):
        payload = await read_json(request, max(max_body, 64 * service.y_bytes
                                               * service.model.num_layers + 4096))
        try:
            stream = service.import_(request.path_params["stream_id"], payload)
        except Refused as e:
            return refused(e)
        return JSONResponse({"stream": stream.id, "t": stream.t}, status_code=201)

    async def error(request, exc):
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code,
                            headers=exc.headers)

    routes = [*(Route(path, probe(check), methods=["GET"]) for path, check in PROBES.items()),
              Route("/metrics", scrape, methods=["GET"]),
              Route("/streams", admin(listing), methods=["GET"]),
              Route("/streams", create, methods=["POST"]),
              Route("/streams/{stream_id}/step", step, methods=["POST"]),
              Route("/streams/{stream_id}", admin(delete), methods=["DELETE"]),
              Route("/streams/{stream_id}/export", admin(export), methods=["POST"]),
              Route("/streams/{stream_id}/state", admin(put_state), methods=["PUT"])]
    return Starlette(routes=routes, exception_handlers={HTTPException: error})
