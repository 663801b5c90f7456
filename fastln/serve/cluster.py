"""Servers coming and going behind a proxy that routes by stream id: the
streams move to the servers the proxy now routes their ids to.

A stream lives in one server. When the proxy's list of servers changes (a
server joins, or one is taken out to stop it), a consistent hash routes about
1/N of the ids to another server, and those streams move there with export
and import (:func:`fastln.serve.client.move_stream`): each one's client, closed
with 4410, reconnects through the proxy with its resume token and resumes on
the new owner.

Who owns an id: ``GET /owner/ID`` through the proxy reaches the server the
proxy routes ID to, which answers with its own addresses (``--advertise``).
One answer does not settle it while the list changes: after ``nginx -s
reload`` the old workers go on taking connections, and routing them by the
old list, beside the new workers for a while (about 100 ms; longer on a busy
machine). So an owner is decided one of two ways:

- **nginx** (``upstream=``, the list that nginx includes): :class:`NginxUpstream`
  computes the server that ``hash $stream_id consistent`` picks for each id,
  as nginx does (ketama: 160 crc32 points a server, see its
  ``ngx_http_upstream_hash_module.c``), and the proxy only confirms it: the
  stream waits until ``/owner/ID`` names that server, which only a worker with
  the new list does. The owner does not depend on which worker answered, and
  nothing moves before nginx has loaded the list.
- **another proxy** (Envoy's ring hash is not computed here): the owners are
  the proxy's answers once two passes over all the ids, ``settle`` seconds
  apart, answer alike.

Each call lists the servers, decides the owner of every stream they hold, and
then moves the streams, one at a time; a stream just moved is not looked at
again. A moved stream's client that reconnects through an old worker reaches
the server it left, which answers 4404: clients retry 4404 for a few seconds
after a 4410, until the old workers stop taking connections.

    from fastln.serve.cluster import drain, rebalance

    upstream = "/etc/nginx/fastln/upstream.conf"   # after editing it and nginx -s reload:
    rebalance("http://proxy", ["http://10.0.0.11:8000", ...], admin_token, upstream=upstream)
    drain("http://proxy", "http://10.0.0.12:8000", admin_token, upstream=upstream)  # then SIGTERM

Server addresses are HTTP ones (``--port``), written as the servers'
``--advertise`` names them (``http://ADDRESS:PORT``), since that is what the
proxy's answers are compared with; the upstream list names each server as
``ADDRESS:WS_PORT``, the same ADDRESS.
"""
import bisect
import os
import re
import time
import zlib
from typing import NamedTuple

from .client import MoveError, move_stream, request

POINTS = 160       # ketama points of a server of weight 1 (nginx's, and Cache::Memcached's)
TRIES = 21         # points nginx looks at past down servers before it gives up on the hash


class Move(NamedTuple):
    """One stream moved: its id, the HTTP addresses it left and reached, and
    its step count when it moved."""

    stream: str
    source: str
    target: str
    t: int


class NginxUpstream:
    """An nginx upstream list (the ``server`` lines of docs/nginx/upstream.conf)
    and the server that nginx's ``hash $stream_id consistent`` routes an id
    to.

    Each server line ``server ADDRESS [weight=W] [down] [...];`` puts
    160 x W points on a ring of 32-bit hashes: the crc32 of HOST, a zero
    byte, PORT and PREV, where ADDRESS splits at its last ':' into HOST and
    PORT (``unix:PATH``: HOST is PATH, PORT is empty) and PREV is the
    server's previous point as 4 little-endian bytes (0 for the first).
    An id goes to the server of the first point at or past crc32 of the id,
    and past the points of down servers, as nginx does (after 21 points it
    gives up on the hash: :meth:`route` raises). The result matches nginx
    while no server is skipped for failing (``max_fails=0``, or none failed
    within ``fail_timeout``) or for ``max_conns``, and while each ADDRESS is
    one address (a name that resolves to several has them picked in turn,
    not by the hash).

    Parameters
    ----------
    text : str
        The list, in nginx's syntax: ``server`` lines, and comments. Other
        directives (the rest of the upstream block is in fastln.conf) and
        ``backup`` (which ``hash`` does not take) are a ValueError.
    name : str, optional
        The list's name in error messages, such as its path.
    """

    def __init__(self, text, name="the upstream list"):
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        self.name = name
        self.servers = []      # [(ADDRESS, weight, down)] in the list's order
        for line, words in _statements(text, name):
            where = f"{name}, line {line}"
            if words[0] != "server" or len(words) < 2:
                raise ValueError(f"{where}: {words[0]!r} is not a server line; the list "
                                 f"holds only 'server ADDRESS [weight=W] [down] ...;' lines")
            weight, down = 1, False
            for word in words[2:]:
                if word.startswith("weight="):
                    if not re.fullmatch(r"[1-9][0-9]{0,3}|10000", word[7:]):
                        raise ValueError(f"{where}: {word!r}: a weight is an integer from 1 "
                                         f"to 10000")
                    weight = int(word[7:])
                elif word == "down":
                    down = True
                elif word == "backup":
                    raise ValueError(f"{where}: nginx's hash takes no backup servers")
            self.servers.append((words[1], weight, down))
        if not self.servers:
            raise ValueError(f"{name} lists no server")
        points = {}
        for address, weight, _ in self.servers:
            host, port = _host_port(address)
            base = zlib.crc32(host.encode() + b"\0" + port.encode())
            point = 0
            for _ in range(POINTS * weight):
                point = zlib.crc32(point.to_bytes(4, "little"), base)
                points.setdefault(point, address)     # nginx keeps one of equal points
        self._hashes = sorted(points)
        self._addresses = [points[h] for h in self._hashes]
        self._up = {address for address, _, down in self.servers if not down}

    @classmethod
    def read(cls, path):
        """The list in the file at path (nginx's fastln/upstream.conf)."""
        with open(path, encoding="utf-8") as f:
            return cls(f.read(), os.fspath(path))

    def route(self, stream_id):
        """The ADDRESS (as the list writes it) of the server that nginx routes
        stream_id to; ValueError where nginx picks a server by round robin
        instead of by the hash (an empty id; every server on 21 points of the
        ring down)."""
        if not isinstance(stream_id, str):
            raise TypeError(f"stream_id must be a str, got {type(stream_id).__name__}")
        if len(self.servers) == 1 and not self.servers[0][2]:
            return self.servers[0][0]                  # one server: nginx routes all to it
        if stream_id:
            i = bisect.bisect_left(self._hashes, zlib.crc32(stream_id.encode()))
            for k in range(TRIES):
                address = self._addresses[(i + k) % len(self._addresses)]
                if address in self._up:
                    return address
        raise ValueError(f"nginx routes {stream_id!r} by round robin, not by the hash, "
                         f"with {self.name}: an empty id, or too many servers down")

    def ws(self, stream_id):
        """The WebSocket address, ``ws://ADDRESS``, that the server nginx routes
        stream_id to names itself with (its /owner answer's ``"ws"``): ADDRESS
        with nginx's default port, 80, when it has none."""
        address = self.route(stream_id)
        return f"ws://{address}" if _host_port(address)[1] else f"ws://{address}:80"


# a word of nginx's syntax: blanks, a comment, ';', a brace, a quoted word, a bare word
_WORD = re.compile(r"""\s+|#[^\n]*|;|[{}]|"((?:[^"\\]|\\.)*)"|'((?:[^'\\]|\\.)*)'|[^\s;{}"']+""")


def _statements(text, name):
    """(line, words) of each statement of nginx's syntax in text: its words
    up to the ';', quotes taken off; comments passed over."""
    words, start, line, pos = [], 1, 1, 0
    while pos < len(text):
        m = _WORD.match(text, pos)
        if m is None:
            raise ValueError(f"{name}, line {line}: a quote that does not close")
        word, pos = m.group(), m.end()
        if word == ";":
            if not words:
                raise ValueError(f"{name}, line {line}: an empty statement")
            yield start, words
            words = []
        elif word in ("{", "}"):
            raise ValueError(f"{name}, line {line}: a block ({word!r}); the list holds only "
                             f"server lines")
        elif not word.isspace() and not word.startswith("#"):
            if not words:
                start = line
            quoted = m.group(1) if m.group(1) is not None else m.group(2)
            words.append(word if quoted is None else re.sub(r"\\(.)", r"\1", quoted))
        line += word.count("\n")
    if words:
        raise ValueError(f"{name}, line {start}: a statement without its ';'")


def _host_port(address):
    """nginx's split of a server ADDRESS for the hash: (HOST, PORT), PORT
    the digits after the last ':' ('' if none), 'unix:PATH' as (PATH, '')."""
    if address[:5].lower() == "unix:":
        return address[5:], ""
    split = re.fullmatch(r"(.*):([0-9]*)", address, re.DOTALL)
    return split.groups() if split else (address, "")


def _upstream(upstream):
    """upstream as an NginxUpstream: the list itself, a path, or None."""
    if upstream is None or isinstance(upstream, NginxUpstream):
        return upstream
    if isinstance(upstream, (str, os.PathLike)):
        return NginxUpstream.read(upstream)
    raise TypeError(f"upstream must be an NginxUpstream, the path of nginx's upstream list "
                    f"or None, got {type(upstream).__name__}")


def streams(server, admin_token=None):
    """{stream id: steps run} of every stream the server at HTTP address
    server holds (its admin ``GET /streams``); RuntimeError if it does not answer."""
    status, reply = request("GET", f"{server}/streams", admin_token=admin_token)
    if status != 200:
        raise RuntimeError(f"{server} did not list its streams: {status} {reply}")
    return reply["streams"]


def _answer(proxy, stream_id):
    """The /owner answer for stream_id through the proxy: {"http": ..., "ws": ...}."""
    status, reply = request("GET", f"{proxy}/owner/{stream_id}")
    if status != 200 or "http" not in reply or "ws" not in reply:
        raise RuntimeError(f"{proxy} did not name the owner of {stream_id!r}: {status} {reply}")
    return reply


def owner(proxy, stream_id):
    """The HTTP address of the server that the proxy at HTTP address proxy
    routes stream_id to: ``GET /owner/ID`` through the proxy reaches that
    server, which names itself. RuntimeError if no server answers. One
    answer: while the proxy reloads, two may differ (see the module's notes)."""
    return _answer(proxy, stream_id)["http"]


def owners(proxy, stream_ids, *, upstream=None, timeout=30.0, settle=1.0):
    """{stream id: HTTP address of its owner} for each of stream_ids, decided
    as the module's notes say: with upstream (an :class:`NginxUpstream` or
    the path of its file), the server the list routes the id to, once the
    proxy names it; without, the proxy's answers once two passes over all
    the ids, settle seconds apart, answer alike.

    RuntimeError when that does not happen within timeout seconds: the
    proxy does not route as the list does (nginx has not loaded it, or a
    server's ``--advertise`` names it otherwise than the list), or its
    answers keep changing.
    """
    upstream = _upstream(upstream)
    ids = list(stream_ids)
    deadline = time.monotonic() + timeout
    if upstream is not None:
        found = {}
        for sid in ids:
            want = upstream.ws(sid)
            while (reply := _answer(proxy, sid))["ws"] != want:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{proxy} still routes {sid!r} to {reply['ws']} after {timeout} s, and "
                        f"{upstream.name} to {want}: has nginx loaded that list (nginx -s "
                        f"reload), and does each server's --advertise name it as the list does?")
                time.sleep(0.02)
            found[sid] = reply["http"]
        return found
    found = {sid: owner(proxy, sid) for sid in ids}
    while ids:
        time.sleep(settle)
        last, found = found, {sid: owner(proxy, sid) for sid in ids}
        if found == last:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"{proxy}'s answers for {len(ids)} streams did not settle "
                               f"within {timeout} s")
    return found


def _move(stream_id, source, target, admin_token, moves, failed):
    """Moves one stream, appending a Move to moves, or (id, why) to failed;
    a stream that ended since its listing (its export answers 404) is passed over."""
    try:
        t = move_stream(stream_id, source, target, admin_token)
    except MoveError as e:
        if (e.stage, e.status) != ("export", 404):
            failed.append((stream_id, str(e)))
        return
    moves.append(Move(stream_id, source, target, t))


def _raise_failed(failed):
    if failed:
        raise RuntimeError(f"{len(failed)} streams did not move:\n" + "\n".join(
            f"  {sid}: {why}" for sid, why in failed))


def rebalance(proxy, servers, admin_token=None, *, upstream=None, timeout=30.0,
              settle=1.0):
    """Moves every stream that a server of servers holds to the server the
    proxy routes its id to, once the proxy's list has changed.

    Parameters
    ----------
    proxy : str
        The proxy's HTTP address, ``http://HOST[:PORT]``; it routes
        ``/owner/ID`` as it routes ``/ws/ID``.
    servers : sequence of str
        The HTTP addresses of the servers that may hold streams, new and old,
        as their ``--advertise`` names them.
    admin_token : str, optional
        The servers' admin token, for listing, export and import.
    upstream : str, os.PathLike or NginxUpstream, optional
        With nginx, its upstream list as it is now (the path of
        fastln/upstream.conf): each stream's owner is the server the list
        routes its id to, once the proxy names it. Without it, the owners
        are the proxy's settled answers (see :func:`owners`).
    timeout : float, optional
        Seconds to wait for the proxy to route as upstream does (nginx's
        reload), or for its answers to settle.
    settle : float, optional
        Without upstream, the seconds between the passes whose answers must
        agree.

    Returns
    -------
    list of Move
        The streams moved, in the order they moved. A second call right
        after moves none.

    Raises
    ------
    RuntimeError
        When the proxy does not route as upstream does, or its answers do
        not settle, within timeout (nothing has moved then); after trying
        every stream, when some did not move (a target that refused one
        returns it to its source; the message lists each and why); or when
        a server does not list its streams.

    The servers are listed once, each stream's owner is decided, and then
    the streams move one at a time, so that each waits only for its own
    export and import. Each move closes the stream's WebSocket with 4410;
    its client reconnects through the proxy and resumes on the new owner.
    """
    if isinstance(servers, str):
        raise TypeError("servers must be a sequence of HTTP addresses, not one str")
    held = [(server, sid) for server in servers for sid in streams(server, admin_token)]
    targets = owners(proxy, [sid for _, sid in held], upstream=upstream, timeout=timeout,
                     settle=settle)
    moves, failed = [], []
    for server, sid in held:
        if targets[sid] != server:
            _move(sid, server, targets[sid], admin_token, moves, failed)
    _raise_failed(failed)
    return moves


def drain(proxy, server, admin_token=None, timeout=30.0, *, upstream=None, settle=1.0):
    """Moves every stream of server to the server the proxy routes its id
    to, once the proxy's list no longer holds server. Then the server holds
    nothing, and SIGTERM stops it.

    Parameters
    ----------
    proxy : str
        The proxy's HTTP address, as for :func:`rebalance`.
    server : str
        The HTTP address of the server that leaves, as its ``--advertise``
        names it.
    admin_token : str, optional
        The servers' admin token.
    upstream : str, os.PathLike or NginxUpstream, optional
        With nginx, its upstream list as it is now, without server; as for
        :func:`rebalance`.
    timeout : float, optional
        Seconds to wait for the proxy to route as upstream does, or, without
        upstream, while it still routes ids to server.
    settle : float, optional
        As for :func:`rebalance`.

    Returns
    -------
    list of Move
        The streams moved, in the order they moved.

    Raises
    ------
    RuntimeError
        When upstream routes ids to server (at once, before any move); when
        the proxy does not route as upstream does within timeout (nginx has
        not loaded it); without upstream, when the proxy still routes ids to
        server after timeout seconds (the list still holds it, or the proxy
        has not reloaded); or when a stream does not move (the message lists
        each and why).

    Until the proxy's new list takes effect in all its workers, it may
    still route new streams to server: drain lists the server again, moving
    what it finds, until it holds none.
    """
    upstream = _upstream(upstream)
    deadline = time.monotonic() + timeout
    moves, failed = [], []
    while True:
        tried = {sid for sid, _ in failed}     # returned to server: not tried again
        ids = [sid for sid in streams(server, admin_token) if sid not in tried]
        if not ids:
            break
        targets = owners(proxy, ids, upstream=upstream, settle=settle,
                         timeout=max(deadline - time.monotonic(), 0))
        stuck = [sid for sid in ids if targets[sid] == server]
        if stuck and upstream is not None:     # the list holds server: nothing moves
            raise RuntimeError(f"{upstream.name} still routes {len(stuck)} streams to "
                               f"{server} (e.g. {stuck[0]!r}): is it out of the list, and has "
                               f"nginx reloaded?")
        for sid in ids:
            if targets[sid] != server:
                _move(sid, server, targets[sid], admin_token, moves, failed)
        if stuck:
            if time.monotonic() > deadline:
                _raise_failed(failed)
                raise RuntimeError(f"{proxy} still routes {len(stuck)} streams to {server} "
                                   f"after {timeout} s (e.g. {stuck[0]!r}): is it out of the "
                                   f"proxy's list, and has the proxy reloaded?")
            time.sleep(0.05)
    _raise_failed(failed)
    return moves
