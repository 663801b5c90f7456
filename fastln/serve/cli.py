"""Serves one fastln.rnn model to many streams: binary WebSocket frames, one
connection per stream, over a StreamTable and a StreamBatcher; JSON over HTTP
for curl, health checks and moving streams between servers.

Run::

    python -m fastln.serve.model model.npz          # a new LN-LSTM, I=128, H=256
    fastln-serve --model model.npz [--port 8000] [--ws-port 8001]
        [--state-file streams.npz] [--capacity 1024] [--threads 1]

(``python -m fastln.serve`` is the same as ``fastln-serve``.) --model takes a
file of fastln.serve.model's save_model (float32, float64, bfloat16 or int8),
an .npz of a forward LNLSTM, LNGRU or LSTM's bare state_dict (float or int8),
or an .onnx file with one LSTM, GRU or RNN node. The WebSocket protocol is
fastln.serve.ws's, the HTTP endpoints fastln.serve.http's. With port 0 the
server takes a free port; --ports-file tells the program that started it
which ones (fastln.serve.client.run_server reads it).

Access: each stream has a resume token that its reconnects and HTTP steps
present; the admin endpoints (list, delete, export, import) take the bearer
token of --admin-token-file or $FASTLN_SERVE_ADMIN_TOKEN, and without one the
server listens on a loopback --host only, unless --allow-open-admin. GET
/metrics (Prometheus), /health/live and /health/ready watch it.

Restarts lose nothing: on SIGTERM or SIGINT the server stops taking frames,
lets every step it took finish and answers it, closes every WebSocket with
1012, writes every stream's state and step count to --state-file (a new file,
then renamed over the old one) and exits; on start it loads that file, so a
client that reconnects continues bit for bit where it stopped.

Crashes lose nothing either with --checkpoint-dir DIR (one server's) or
--checkpoint-store redis://HOST:PORT/DB (shared by the servers behind a
proxy): every --checkpoint-interval seconds the streams that stepped are
written there (fastln.serve.checkpoint), clients hear of each checkpoint and
replay the steps after it when a server dies, and with Redis any server
takes over the streams of one that died.

Every step runs through one StreamBatcher: the frames that one pass of the
event loop reads are queued with ``submit`` and answered in its callbacks
(no future or task per frame), and each batch is one ``StreamTable.step`` in
a worker thread.
--echo answers each frame at once with zero bytes of y's size and runs no
model: the transport's own cost, for comparison.
"""
import argparse
import asyncio
import contextlib
import ipaddress
import json
import math
import os
import signal
import socket
import sys

import fastln

from .extra import needs_extra
from .loop import run
from .model import HelpFormatter, freeze, load_model
from .service import Service

with needs_extra(__name__):
    import uvicorn
    from picows import ws_create_server

    from .checkpoint import Checkpointer
    from .http import create_app
    from .store import StoreError, open_store
    from .ws.mux import MAX_STREAMS
    from .ws.routes import ws_factory

ADMIN_TOKEN_ENV = "FASTLN_SERVE_ADMIN_TOKEN"


def port_number(text):
    """A TCP port, 0 (any free one) to 65535, or argparse's error."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number from 0 to 65535, got {port}")
    return port


def make_parser():
    """The command line's parser; every option shows its default in --help."""
    p = argparse.ArgumentParser(prog="fastln-serve", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="a model file: an .npz of fastln.serve.model's "
                        "save_model or of a model's state_dict, or an .onnx file")
    source.add_argument("--onnx", help="an .onnx file with one LSTM, GRU or RNN node")
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    p.add_argument("--advertise",
                   help="the address GET /owner/ID names; None names --host")
    p.add_argument("--port", type=port_number, default=8000,
                   help="the HTTP (JSON) port; 0 picks a free one")
    p.add_argument("--ws-port", type=port_number, default=8001,
                   help="the WebSocket port; 0 picks a free one")
    p.add_argument("--capacity", type=int, default=1024, help="streams held at most")
    p.add_argument("--max-batch", type=int, default=256, help="steps per batch at most")
    p.add_argument("--max-delay-ms", type=float, default=0.0,
                   help="how long the oldest waiting step waits for others to join its batch")
    p.add_argument("--max-queue-per-stream", type=int, default=64,
                   help="frames of one stream waiting at most")
    p.add_argument("--max-frame", type=int, default=1 << 16,
                   help="bytes of one WebSocket frame at most")
    p.add_argument("--max-body", type=int, default=1 << 16, help="HTTP request body bytes at most")
    p.add_argument("--idle-timeout", type=float, default=600.0,
                   help="seconds a stream with no connection is kept")
    p.add_argument("--ping", type=float, default=20.0,
                   help="seconds of silence before a ping, and for its answer; a peer that "
                        "does not answer is disconnected and its stream kept")
    p.add_argument("--state-file",
                   help="where SIGTERM writes the streams, and where a start reads them")
    store = p.add_mutually_exclusive_group()
    store.add_argument("--checkpoint-dir",
                       help="checkpoint the streams to this directory (one server's: a "
                            "start loads them), so that a server killed loses none")
    store.add_argument("--checkpoint-store",
                       help="checkpoint the streams to Redis, redis://HOST:PORT/DB, shared by "
                            "the servers behind a proxy: any of them takes over the streams "
                            "of one that died")
    p.add_argument("--checkpoint-interval", type=float, default=1.0,
                   help="seconds between two checkpoints")
    p.add_argument("--checkpoint-steps", type=int,
                   help="also checkpoint after this many steps of the server")
    p.add_argument("--lease", type=float, default=5.0,
                   help="seconds a server's lease on its streams lasts in --checkpoint-store "
                        "(renewed every quarter of it): how long its streams wait after it "
                        "is lost, unless its address refuses connections")
    p.add_argument("--ports-file",
                   help="where the server writes its ports once it serves, as JSON "
                        "{\"host\": HOST, \"port\": PORT, \"ws_port\": WS_PORT}: how a "
                        "program that starts it with port 0 learns them")
    p.add_argument("--threads", type=int, default=1,
                   help="fastln's threads (the event loop and the batch thread need a core too)")
    p.add_argument("--max-connections", type=int, default=4096,
                   help="WebSocket connections open at once at most; one more is closed "
                        "with 1013")
    p.add_argument("--max-streams-per-connection", type=int, default=MAX_STREAMS,
                   help="streams one multiplexed connection (/mux) holds at most; an open "
                        "past it is refused with 1013")
    p.add_argument("--admin-token-file",
                   help="a file whose first line is the bearer token the admin endpoints "
                        f"require; None reads ${ADMIN_TOKEN_ENV}, and without either they "
                        "take no credential")
    p.add_argument("--allow-open-admin", action="store_true",
                   help="listen on a non-loopback --host with no admin token (anyone who "
                        "reaches --port can list, delete, export and import streams)")
    p.add_argument("--echo", action="store_true",
                   help="answer each frame with zero bytes at once, running no model")
    return p


def is_loopback(host):
    """Whether host is a loopback address (127.0.0.0/8, ::1) or localhost."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:   # a host name: it may resolve to any address
        return False


def admin_token(p, args):
    """The admin token of --admin-token-file or $FASTLN_SERVE_ADMIN_TOKEN, or
    None; argparse's error for an unreadable or empty file, a token under 16
    characters, or a non-loopback --host without one (and no --allow-open-admin)."""
    where = f"${ADMIN_TOKEN_ENV}"
    token = os.environ.get(ADMIN_TOKEN_ENV)
    if args.admin_token_file:
        where = f"--admin-token-file {args.admin_token_file}"
        try:
            with open(args.admin_token_file, encoding="utf-8") as f:
                token = f.readline().strip()
        except (OSError, UnicodeDecodeError) as e:
            p.error(f"{where}: {getattr(e, 'strerror', None) or e}")
    if token is not None:
        token = token.strip()
        if len(token) < 16 or not token.isprintable():
            p.error(f"{where}: an admin token is at least 16 printable characters "
                    f"(python -c 'import secrets; print(secrets.token_urlsafe(32))' makes one)")
        return token
    if not is_loopback(args.host) and not args.allow_open_admin:
        p.error(f"--host {args.host} is not a loopback address: give the admin endpoints a "
                f"token (--admin-token-file or ${ADMIN_TOKEN_ENV}), or pass --allow-open-admin")
    return None


def open_model(p, args):
    """The model of --model or --onnx, or argparse's error naming the option."""
    flag, path = ("--model", args.model) if args.model else ("--onnx", args.onnx)
    if not os.path.isfile(path):
        p.error(f"{flag} {path}: no such file")
    if flag == "--onnx" or path.lower().endswith(".onnx"):
        try:
            return freeze(fastln.rnn.from_onnx(path))
        except ImportError as e:
            p.error(f"{flag} {path}: reading ONNX needs the onnx package ({e})")
        except Exception as e:   # onnx's parser raises protobuf's DecodeError, among others
            p.error(f"{flag} {path}: not an ONNX model fastln.rnn.from_onnx reads "
                    f"({type(e).__name__}: {e})")
    try:
        return load_model(path)
    except (OSError, TypeError, ValueError) as e:
        p.error(f"{flag} {e}")


def bind(host, port, flag):
    """Sockets bound to port on every address of host, as asyncio's
    create_server binds them, for a server to listen on (port 0: a free port,
    the same on each address); SystemExit with one line that names flag
    when one cannot be bound (the port is taken, the address is not this
    machine's)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise SystemExit(f"fastln-serve: error: --host {host}: {e.strerror}") from None
    sockets = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if len(sockets) > 1:
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            sock.bind(address)
    except OSError as e:
        for sock in sockets:
            sock.close()
        raise SystemExit(f"fastln-serve: error: {flag} {port} on {address[0]}: "
                         f"{e.strerror or e}") from None
    return sockets


def write_ports(path, host, ports):
    """Writes the --ports-file: a new file renamed over any old one, so that
    a reader sees all of it or nothing."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"host": host, "port": ports[1], "ws_port": ports[0]}, f)
    os.replace(tmp, path)


class HTTPServer(uvicorn.Server):
    """uvicorn's server, leaving SIGTERM and SIGINT to the service."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


def store_flag(args):
    """The option that names the checkpoint store, and its value."""
    if args.checkpoint_dir:
        return f"--checkpoint-dir {args.checkpoint_dir}"
    return f"--checkpoint-store {args.checkpoint_store}"


async def serve(args, service, token=None, store=None):
    loop = asyncio.get_running_loop()
    ws_sockets = bind(args.host, args.ws_port, "--ws-port")
    http_sockets = bind(args.host, args.port, "--port")
    ports = [s[0].getsockname()[1] for s in (ws_sockets, http_sockets)]
    if store is not None:
        ck = service.checkpointer = Checkpointer(
            service, store, args.checkpoint_interval, args.checkpoint_steps, args.lease,
            f"{args.advertise or args.host}:{ports[0]}")
        try:
            n = await ck.start()
        except StoreError as e:
            raise SystemExit(f"fastln-serve: error: {store_flag(args)}: {e}") from None
        if args.checkpoint_dir:
            print(f"loaded {n} streams from {args.checkpoint_dir}", flush=True)
    factory = ws_factory(service, ports, args.advertise or args.host)
    # pings find a peer that vanished without closing, so that its stream can be resumed
    ws = [await ws_create_server(factory, sock=sock, max_frame_size=args.max_frame,
                                 enable_auto_ping=True, auto_ping_idle_timeout=args.ping,
                                 auto_ping_reply_timeout=args.ping) for sock in ws_sockets]
    app = create_app(service, ports, args.max_body, token)
    http = HTTPServer(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning",
                                     lifespan="off"))
    http_task = loop.create_task(http.serve(sockets=http_sockets))
    while not http.started:
        if http_task.done():
            http_task.result()
            raise SystemExit(f"the HTTP server on port {args.port} did not start")
        await asyncio.sleep(0.01)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"serving {json.dumps(service.config)}{' (echo)' if service.echo else ''} on "
          f"http://{args.host}:{ports[1]} and ws://{args.host}:{ports[0]}/ws/", flush=True)
    if args.ports_file:
        write_ports(args.ports_file, args.host, ports)
    while not stop.is_set():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), min(args.idle_timeout / 4, 5.0))
        service.sweep(args.idle_timeout)
    await service.drain()
    for server in ws:
        server.close()
    if service.checkpointer is not None:
        await service.checkpointer.stop()
    if args.state_file:
        n = service.save(args.state_file)
        print(f"saved {n} streams to {args.state_file}", flush=True)
    http.should_exit = True
    await http_task
    await service.batcher.aclose()


def main(argv=None):
    p = make_parser()
    args = p.parse_args(argv)
    for name in ("capacity", "max_batch", "max_queue_per_stream", "max_frame", "max_body",
                 "threads", "max_connections", "max_streams_per_connection"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not (args.max_delay_ms >= 0 and math.isfinite(args.max_delay_ms)):
        p.error(f"--max-delay-ms must be finite and at least 0, got {args.max_delay_ms}")
    if args.checkpoint_steps is not None and args.checkpoint_steps < 1:
        p.error(f"--checkpoint-steps must be at least 1, got {args.checkpoint_steps}")
    for name in ("idle_timeout", "ping", "checkpoint_interval", "lease"):
        if not (getattr(args, name) > 0 and math.isfinite(getattr(args, name))):
            p.error(f"--{name.replace('_', '-')} must be finite and above 0, "
                    f"got {getattr(args, name)}")
    if args.ports_file and not os.path.isdir(os.path.dirname(args.ports_file) or "."):
        p.error(f"--ports-file {args.ports_file}: its folder does not exist")
    token = admin_token(p, args)
    fastln.set_num_threads(args.threads)
    model = open_model(p, args)
    service = Service(model, args.capacity, args.max_batch, args.max_delay_ms / 1000,
                      args.max_queue_per_stream, args.echo, args.max_connections,
                      args.max_streams_per_connection, args.max_frame)
    if args.state_file and os.path.exists(args.state_file):
        try:
            n = service.load(args.state_file)
        except (OSError, ValueError, KeyError) as e:
            p.error(f"--state-file {args.state_file}: {e}")
        print(f"loaded {n} streams from {args.state_file}", flush=True)
    store = None
    if args.checkpoint_dir or args.checkpoint_store:
        try:
            store = open_store(args.checkpoint_dir or args.checkpoint_store, service.fingerprint,
                               dtypes=service.state_dtypes, shape=service.state_shape)
        except (OSError, ValueError) as e:
            p.error(f"{store_flag(args)}: {e}")
    run(serve(args, service, token, store))


if __name__ == "__main__":
    sys.exit(main())
