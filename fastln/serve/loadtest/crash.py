"""The load test's runs of a cluster that loses a member: three servers that
checkpoint to one redis-server, behind nginx (the documentation's
fastln.conf, failover included), with closed-loop streams.

- crash / mux-crash: partway, the server that holds the most streams is
  killed (SIGKILL). Each stream it held reconnects (a per-stream connection
  through nginx, whose failover routes it to the next server of its id's
  ring; a multiplexed connection to the server that ``GET /owner/ID``
  through nginx names now), is taken over from Redis at its latest
  checkpoint, and sends the steps after it again; their replies are checked
  bit for bit and counted once. Reported: the streams lost (none may be),
  the mismatches, and the recovery time of each moved stream, from the kill
  to its first reply.
- outage: an open loop (multiplexed connections); a third of the way in,
  redis-server stops for ``outage`` seconds and starts again (empty: it
  keeps no data); the streams step on. Reported: the errors (none may be),
  the failed checkpoints, and how long after Redis returned every server had
  written a checkpoint again.
"""
import asyncio
import contextlib
import json
import os
import tempfile
import time
from collections import defaultdict

import numpy as np

from ..extra import needs_extra

with needs_extra(__name__):
    from picows import WSError

    from ..client import request, run_server
    from .clients import MuxConn, Run, Stream
    from .drive import connect_all, result, send_open_loop, split, wait_done
    from .procs import Nginx, RedisServer, binary

SERVERS = 3
RETRY = (0.02, 0.5)      # a reconnect's first wait and its longest, doubling between


def programs():
    """(nginx, redis-server) paths; RuntimeError naming the one missing."""
    found = (binary("nginx", "/usr/sbin/nginx"), binary("redis-server", "/usr/bin/redis-server"))
    for name, path in zip(("nginx", "redis-server"), found):
        if path is None:
            raise RuntimeError(f"the crash runs need {name} (Debian: apt install {name})")
    return found


@contextlib.contextmanager
def cluster(model_path, server_args, nginx_conf, interval=1.0, lease=5.0):
    """redis-server, SERVERS servers checkpointing to it every interval
    seconds, and nginx in front of them (upstream lines with
    ``max_fails=1 fail_timeout=5s``, as the docs' list); yields (redis,
    servers, nginx)."""
    nginx_path, redis_path = programs()
    with contextlib.ExitStack() as stack:
        redis = RedisServer(redis_path).start()
        stack.callback(redis.close)
        servers = [stack.enter_context(run_server(
            "--model", model_path, "--checkpoint-store", redis.url, "--advertise", "127.0.0.1",
            "--checkpoint-interval", interval, "--lease", lease, *server_args))
            for _ in range(SERVERS)]
        nginx = Nginx(nginx_path, stack.enter_context(tempfile.TemporaryDirectory()),
                      nginx_conf)
        nginx.upstream(servers, "max_fails=1 fail_timeout=5s")
        nginx.start()
        stack.callback(nginx.stop)
        yield redis, servers, nginx


def owner_ws(proxy_http, sid):
    """The WebSocket address of the server that the proxy routes sid to now."""
    status, reply = request("GET", f"{proxy_http}/owner/{sid}", timeout=10)
    if status != 200:
        raise RuntimeError(f"no owner of {sid!r} through the proxy: {status} {reply}")
    return reply["ws"]


async def owners_of(proxy_http, sids):
    """{sid: ws address of its owner}, asked through the proxy in a thread."""
    loop = asyncio.get_running_loop()
    found = await asyncio.gather(*(loop.run_in_executor(None, owner_ws, proxy_http, sid)
                                   for sid in sids))
    return dict(zip(sids, found))


async def retrying(attach, deadline):
    """attach() until it answers: a refusal to retry (4409: another server
    holds it; 4404: not there yet; 1013; a failed connection) waits and tries
    again until deadline. Returns its answer, or raises its last error."""
    wait = RETRY[0]
    while True:
        try:
            return await attach()
        except (OSError, WSError, asyncio.TimeoutError) as e:   # Closed is an OSError
            code = getattr(e, "code", None)
            if code not in (None, 1006, 1011, 1012, 1013, 4404, 4409) \
                    or time.monotonic() + wait > deadline:
                raise
        await asyncio.sleep(wait)
        wait = min(2 * wait, RETRY[1])


def busiest(servers):
    """The server that holds the most streams, and how many."""
    counts = [len(request("GET", s.http + "/streams", timeout=10)[1]["streams"])
              for s in servers]
    k = int(np.argmax(counts))
    return servers[k], counts[k]


async def run_until(run, clients, fraction, total, deadline):
    while (sum(c.received * c.width for c in clients) < fraction * total
           and not run.done.done() and time.monotonic() < deadline):
        await asyncio.sleep(0.01)


async def drive_crash(model_path, server_args, refs, streams, steps, inflight, nginx_conf,
                      connections=None, fraction=0.4, time_limit=60.0, timeout=10.0,
                      interval=1.0, lease=5.0):
    """The crash run (connections None: a connection per stream through
    nginx) or the mux-crash run (the streams on about `connections`
    multiplexed connections, each to its streams' owner). Returns the
    result's dict, with ``recovery_ms`` (each moved stream's wait) and
    ``moved``."""
    run = Run(streams if connections is None else 0)
    deadline = time.monotonic() + time_limit
    with cluster(model_path, server_args, nginx_conf, interval, lease) as (_, servers, nginx):
        if connections is None:
            clients = [Stream(run, f"s{i}-crash", refs, i, steps, inflight)
                       for i in range(streams)]
            await connect_all(clients, nginx.ws, True, timeout)
        else:
            clients = await mux_clients(run, refs, nginx, streams, steps, inflight, connections,
                                        timeout)
        start = time.perf_counter()
        for c in clients:
            if c.connected:
                c.pump()
        await run_until(run, clients, fraction, streams * steps, deadline)
        # every stream has a checkpoint by now: one opened and killed before its
        # first one restarts from step 0 (the product's clients replay it; the
        # load test counts it lost)
        await asyncio.sleep(max(0.0, start + 2 * interval - time.perf_counter()))
        if run.done.done():
            run.fail("errors", "the run ended before the kill: give it more --crash-steps")
        victim, held = busiest(servers)
        run.restarting = True        # drops and 1012s are expected now
        for c in clients:
            c.first_reply = None
        killed = time.perf_counter()
        victim.proc.kill()
        victim.proc.wait()
        moved = await recover(run, clients, refs, nginx, steps, inflight, timeout, deadline)
        await wait_done(run, clients, max(1.0, deadline - time.monotonic()))
        seconds = time.perf_counter() - start
        out = result(run, clients, seconds)
        await asyncio.gather(*(c.close() for c in clients if c.connected),
                             return_exceptions=True)
    waits = [c.first_reply - killed for c in moved if c.first_reply is not None]
    out["recovery_ms"] = np.asarray(waits) * 1e3
    out["moved"] = sum(c.width for c in moved)
    print(f"    killed a server that held {held} streams; {out['moved']} moved, recovery "
          f"p50 {np.percentile(waits, 50) * 1e3 if waits else float('nan'):.0f} ms, "
          f"p99 {np.percentile(waits, 99) * 1e3 if waits else float('nan'):.0f} ms, "
          f"max {max(waits, default=float('nan')) * 1e3:.0f} ms", flush=True)
    return out


async def mux_clients(run, refs, nginx, streams, steps, inflight, connections, timeout):
    """Multiplexed connections to each stream's owner (asked through nginx),
    about `connections` in all, split evenly on each server."""
    sids = [f"s{i}-crash" for i in range(streams)]
    owners = await owners_of(nginx.http, sids)
    groups = defaultdict(list)
    for i, sid in enumerate(sids):
        groups[owners[sid]].append(i)
    clients = []
    per = max(1, connections // max(1, len(groups)))
    for ws, indices in groups.items():
        for first, width in split(len(indices), per):
            c = MuxConn(run, "crash", refs, indices[first:first + width], steps, inflight)
            c.home = ws
            clients.append(c)
    run.pending = len(clients)
    for c in clients:
        await c.open(c.home, True, timeout)
    return clients


async def recover(run, clients, refs, nginx, steps, inflight, timeout, deadline):
    """Reconnects the clients whose connection the kill ended, as they find
    out, until every one is back or done; returns those that moved (for a
    multiplexed connection, the connections that replace it)."""
    moved, tasks = [], []
    settle = time.monotonic() + 1.0      # the kill's drops reach every client within it
    pending = set()
    while time.monotonic() < settle or tasks and not all(t.done() for t in tasks):
        for c in list(clients):
            if c.closed is not None and not c.is_done and c not in pending:
                pending.add(c)
                if isinstance(c, MuxConn):
                    tasks.append(asyncio.ensure_future(
                        reopen_mux(run, c, clients, moved, refs, nginx, steps, inflight,
                                   timeout, deadline)))
                else:
                    moved.append(c)
                    tasks.append(asyncio.ensure_future(
                        reopen(c, nginx.ws, timeout, deadline)))
        await asyncio.sleep(0.01)
    for t in tasks:
        if t.exception() is not None:
            raise t.exception()
    return moved


async def reopen(c, ws, timeout, deadline):
    """One stream back through nginx: taken over, restored, replaying."""
    async def attach():
        c.quiet = True              # a refusal's close is retried, not an error
        try:
            return await c.attach(ws, False, timeout)
        finally:
            c.quiet = False
    try:
        hello = await retrying(attach, deadline)
    except (OSError, WSError, asyncio.TimeoutError) as e:
        c.end("lost", f"{c.sid}: no reconnect: {type(e).__name__} {e}")
        return
    if c.resume(hello.get("t")) and not c.is_done:
        c.pump()


async def reopen_mux(run, dead, clients, moved, refs, nginx, steps, inflight, timeout,
                     deadline):
    """A multiplexed connection's streams, on the servers that own them now:
    a connection per (owner, restored step), each taking up where its
    streams' checkpoint left them."""
    clients.remove(dead)
    dead.is_done = True               # its streams go on in the connections below
    owners = await owners_of(nginx.http, dead.sids)
    groups = defaultdict(list)
    for index, sid in zip(dead.indices, dead.sids):
        groups[owners[sid]].append(index)
    for ws, indices in groups.items():
        attempt = MuxConn(run, "crash", refs, indices, steps, inflight)
        attempt.tokens = dead.tokens
        try:
            entries = await retrying(lambda a=attempt, w=ws: opened(a, w, timeout), deadline)
        except (OSError, WSError, asyncio.TimeoutError) as e:
            run.fail("lost", f"{attempt.sid}: no reconnect: {type(e).__name__} {e}")
            continue
        by_t = defaultdict(list)
        for index, entry in zip(indices, entries):
            by_t[entry["t"]].append(index)
        if len(by_t) > 1:             # streams restored at different steps: one connection each
            attempt.quiet = True
            await attempt.close(1001)
        for t, group in by_t.items():
            c = attempt if len(by_t) == 1 else MuxConn(run, "crash", refs, group, steps,
                                                       inflight)
            if c is not attempt:
                c.tokens = dead.tokens
                try:
                    await retrying(lambda c=c, w=ws: opened(c, w, timeout), deadline)
                except (OSError, WSError, asyncio.TimeoutError) as e:
                    run.fail("lost", f"{c.sid}: no reconnect: {type(e).__name__} {e}")
                    continue
            run.pending += 1
            c.received = c.sent = dead.received
            clients.append(c)
            moved.append(c)
            if c.resume(t) and not c.is_done:
                c.pump()
    run.finished()                    # the dead connection's count


async def opened(c, ws, timeout):
    """A connection's open, every entry attached: their entries; a refused
    entry raises OSError with its code (retried where it may be)."""
    c.quiet = True                  # a refusal's close is retried, not an error
    try:
        entries = await c.attach(ws, False, timeout)
        refused = next((e for e in entries if "index" not in e), None)
        if refused is not None:
            await c.close(1001)
    finally:
        c.quiet = False
    if refused is not None:
        e = OSError(f"open refused: {json.dumps(refused)[:200]}")
        e.code = refused.get("code")
        raise e
    c.tokens = {**c.tokens, **{e["stream"]: e["token"] for e in entries}}
    return entries


async def drive_outage(model_path, server_args, refs, streams, hz, nginx_conf, outage=10.0,
                       time_limit=120.0, timeout=10.0, interval=1.0, connections=8, seed=0):
    """The outage run: the streams on multiplexed connections in an open loop
    at hz (so that the load goes on through the outage), for 2 x outage + 4
    seconds; after a third of them, redis-server stops for `outage` seconds.
    Returns the result's dict, with ``failed_checkpoints`` and ``resumed_s``
    (from Redis's return to the last server's first checkpoint after it)."""
    seconds = 2 * outage + 4
    steps = max(1, round(hz * seconds))
    run = Run(0)
    with cluster(model_path, server_args, nginx_conf, interval) as (redis, servers, nginx):
        clients = await mux_clients(run, refs, nginx, streams, steps, 0, connections, timeout)
        start = time.perf_counter() + 0.05
        lags = send_open_loop(clients, hz, np.random.default_rng([seed, streams]), start)
        await asyncio.sleep(max(0.0, start + seconds / 3 - time.perf_counter()))
        redis.stop()
        await asyncio.sleep(outage)
        failed = sum(checkpoints(s)["failed"] for s in servers)
        redis.start()
        back = time.monotonic()
        resumed = await written_since(servers, back, back + time_limit)
        await wait_done(run, clients, max(1.0, start + seconds + time_limit
                                          - time.perf_counter()))
        out = result(run, clients, time.perf_counter() - start, lags=lags)
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
    out["failed_checkpoints"], out["resumed_s"] = failed, resumed
    print(f"    Redis down {outage:g} s: {failed} checkpoint writes failed; every server "
          f"checkpointed again {resumed:.2f} s after it returned", flush=True)
    return out


def checkpoints(server):
    """The server's /health/ready store counters."""
    return request("GET", server.http + "/health/ready", timeout=10)[1]["store"]["checkpoints"]


async def written_since(servers, since, deadline):
    """Seconds from `since` until every server has written a checkpoint after it."""
    loop = asyncio.get_running_loop()
    last = {id(s): checkpoints(s)["ok"] for s in servers}
    waiting = set(last)
    while waiting and time.monotonic() < deadline:
        for s in servers:
            if id(s) in waiting:
                ok = (await loop.run_in_executor(None, checkpoints, s))["ok"]
                if ok > last[id(s)]:
                    waiting.discard(id(s))
        await asyncio.sleep(0.02)
    return time.monotonic() - since if not waiting else float("inf")


def default_conf():
    """docs/nginx/fastln.conf of the checkout this fastln runs from, or None."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "..", "..", "docs", "nginx", "fastln.conf")
    return os.path.normpath(path) if os.path.exists(path) else None
