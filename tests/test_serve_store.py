"""The checkpoint stores of fastln.serve.store.

- Records: round trips of every state dtype and byte order, and each error
  of encode and decode.
- The directory store: generations, removals and full compaction as
  load_all reads them; one live server per directory (flock); a child
  process killed with SIGKILL while it writes big checkpoints, after which
  load_all finds a whole earlier checkpoint; a full disk (ENOSPC, raised
  part-way through a write) that leaves nothing half-written; temporary
  files left by a crash.
- The Redis store, against a real redis-server that a fixture starts on
  127.0.0.1 (no persistence, in a temporary folder): fenced writes, take in
  each of its cases (no owner, its own, a live owner, a dead owner whose
  lease lives, an expired lease), leases, ownership, chunked writes, Redis
  killed (a StoreError within a second, not a hang) and restarted, a paused
  Redis (a timeout), and the key namespaces of two models. Skipped where
  redis-server is not installed, but a failure under CI=1, which installs
  Debian's.
"""
import asyncio
import errno
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest

from fastln.serve import loop
from fastln.serve.store import (
    DirStore,
    Held,
    Record,
    ServerInfo,
    StoreError,
    decode,
    directory,
    encode,
    open_store,
)

from _util import package_parent, require

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
SHAPE = (2, 1, 8)
DTYPES = [F32, F32]


def run(coro, timeout=30):
    return loop.run(asyncio.wait_for(coro, timeout))


def token_hash(token):
    return hashlib.sha256(token.encode()).digest()


def make_record(stream, t, dtypes=DTYPES, shape=SHAPE):
    """A record whose state holds t + the array's index + a ramp."""
    size = int(np.prod(shape))
    state = [(t + i + np.arange(size) / size).astype(d).reshape(shape)
             for i, d in enumerate(dtypes)]
    return Record(stream, t, token_hash(f"token-{stream}"), state)


def same(a, b):
    return (a.stream == b.stream and a.t == b.t and a.token_hash == b.token_hash
            and len(a.state) == len(b.state)
            and all(x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y)
                    for x, y in zip(a.state, b.state)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- records ------------------------------------------------------------------------

@pytest.mark.parametrize("dtypes,shape", [([F32, F32], (2, 1, 8)), ([F64, F64, F64], (1, 1, 5)),
                                          ([F32], (3, 1, 256)), ([], (2, 1, 4))])
def test_record_round_trips(dtypes, shape):
    for stream, t in (("s", 0), ("stream-é.1", 2**63 - 1), ("x" * 64, 12345)):
        record = make_record(stream, t, dtypes, shape)
        back = decode(encode(record), dtypes, shape)
        assert same(back, record)
        assert all(a.flags.writeable and a.dtype.isnative for a in back.state)


def test_record_of_big_endian_and_strided_arrays():
    a = np.arange(16, dtype=">f8").reshape(2, 1, 8)
    b = np.arange(32, dtype=np.float32).reshape(2, 1, 16)[:, :, ::2]   # not contiguous
    back = decode(encode(Record("s", 3, bytes(32), [a, b])), [F64, F32], (2, 1, 8))
    assert back.state[0].dtype == F64 and np.array_equal(back.state[0], a)
    assert np.array_equal(back.state[1], b)
    # the bytes are little-endian whatever the arrays' byte order
    assert encode(Record("s", 3, bytes(32), [a])) == \
        encode(Record("s", 3, bytes(32), [a.astype("<f8")]))


def test_record_layout():
    blob = encode(Record("ab", 7, bytes(range(32)), [np.ones((1, 1, 2), np.float32)]))
    assert blob == (b"FLNC" + (1).to_bytes(2, "little") + (7).to_bytes(8, "little")
                    + bytes(range(32)) + (2).to_bytes(2, "little") + b"ab" + b"\x01"
                    + np.ones(2, "<f4").tobytes())


@pytest.mark.parametrize("record,error,match", [
    (("s", 1, bytes(32), []), TypeError, "record must be a Record"),
    (Record(b"s", 1, bytes(32), []), TypeError, "record.stream must be a str"),
    (Record("s" * 70000, 1, bytes(32), []), ValueError, "record.stream is 70000 UTF-8 bytes"),
    (Record("s", 1.0, bytes(32), []), TypeError, "record.t must be an int"),
    (Record("s", True, bytes(32), []), TypeError, "record.t must be an int"),
    (Record("s", -1, bytes(32), []), ValueError, r"record.t must be in \[0, 2\*\*63\)"),
    (Record("s", 2**63, bytes(32), []), ValueError, r"record.t must be in"),
    (Record("s", 1, bytes(31), []), ValueError, "record.token_hash must be 32 bytes.*31 bytes"),
    (Record("s", 1, "0" * 32, []), ValueError, "record.token_hash must be 32 bytes.*a str"),
    (Record("s", 1, bytes(32), [[1.0]]), TypeError, r"record.state\[0\] must be a numeric"),
    (Record("s", 1, bytes(32), [np.array([None])]), TypeError, r"record.state\[0\]"),
    (Record("s", 1, bytes(32), [np.ones(1)] * 256), ValueError, "record.state has 256 arrays"),
])
def test_encode_refuses(record, error, match):
    with pytest.raises(error, match=match):
        encode(record)


GOOD = encode(make_record("s1", 5))
HEAD = 4 + 2 + 8 + 32 + 2   # up to the id


def _patched(at, raw):
    return GOOD[:at] + raw + GOOD[at + len(raw):]


@pytest.mark.parametrize("blob,dtypes,shape,error,match", [
    (GOOD[:20], DTYPES, SHAPE, ValueError, "a checkpoint record is at least 49 bytes, got 20"),
    (b"FLNX" + GOOD[4:], DTYPES, SHAPE, ValueError, "not a checkpoint record: its magic is"),
    (_patched(4, b"\x02\x00"), DTYPES, SHAPE, ValueError, "checkpoint record version 2"),
    (_patched(6, (-1).to_bytes(8, "little", signed=True)), DTYPES, SHAPE, ValueError,
     "t is negative"),
    (_patched(HEAD, b"\xff\xfe"), DTYPES, SHAPE, ValueError, "stream id is not UTF-8"),
    (_patched(HEAD - 2, (60000).to_bytes(2, "little")), DTYPES, SHAPE, ValueError,
     "ends within its 60000-byte id"),
    (GOOD, [F32], SHAPE, ValueError, "'s1' has 2 state arrays, expected 1"),
    (GOOD, [F32, F64], SHAPE, ValueError, r"holds 128 bytes of state.*\['float32', 'float64'\] "
                                          "take 192"),
    (GOOD, DTYPES, (2, 1, 9), ValueError, r"arrays of shape \(2, 1, 9\)"),
    (GOOD + b"\x00", DTYPES, SHAPE, ValueError, "holds 129 bytes of state"),
    (GOOD[:-1], DTYPES, SHAPE, ValueError, "holds 127 bytes of state"),
    ("text", DTYPES, SHAPE, TypeError, "blob must be bytes-like, got str"),
    (GOOD, "float32", SHAPE, TypeError, "dtypes must be a sequence"),
    (GOOD, DTYPES, 8, TypeError, "shape must be a sequence"),
    (GOOD, DTYPES, (2, 1, -8), TypeError, "shape must be a sequence of non-negative ints"),
])
def test_decode_refuses(blob, dtypes, shape, error, match):
    with pytest.raises(error, match=match):
        decode(blob, dtypes, shape)


# ---- the directory store ------------------------------------------------------------

SERVER = ServerInfo("server-a", None, 5.0)


def dir_store(path, fingerprint="model-a"):
    return open_store(str(path), fingerprint, dtypes=DTYPES, shape=SHAPE)


async def load(path, fingerprint="model-a"):
    """load_all of a store started on path (and closed again), by stream id."""
    store = dir_store(path, fingerprint)
    await store.start(SERVER)
    try:
        return {r.stream: r for r in await store.load_all()}
    finally:
        await store.close()


def checkpoint_files(path):
    return sorted(n for n in os.listdir(path) if n.startswith("ckpt-"))


def test_dir_generations_removals_and_full_compaction(tmp_path):
    async def main():
        store = dir_store(tmp_path)
        assert isinstance(store, DirStore) and not store.shared
        await store.start(SERVER)
        assert await store.load_all() == []
        a1, b1, a2, c3 = (make_record("a", 1), make_record("b", 1), make_record("a", 2),
                          make_record("c", 3))
        assert await store.write([a1, b1], []) == []
        assert await store.write([a2], ["b"]) == []
        assert await store.write([c3], []) == []
        await store.write([], [])   # nothing to write: no file
        assert checkpoint_files(tmp_path) == [f"ckpt-{g:012d}.bin" for g in (1, 2, 3)]
        assert await store.take("a", 1.0) is None and await store.renew()
        assert await store.owned(["a", "x"]) == ["a", "x"]
        await store.release(["a"])
        await store.close()

        got = await load(tmp_path)
        assert sorted(got) == ["a", "c"] and same(got["a"], a2) and same(got["c"], c3)

        # a stream removed, then written again in a later generation, is back
        store = dir_store(tmp_path)
        await store.start(SERVER)
        await store.write([], ["a"])
        await store.write([make_record("b", 4)], [])
        got = {r.stream: r for r in await store.load_all()}
        assert sorted(got) == ["b", "c"] and got["b"].t == 4

        # full: one file, standing alone; the older generations are gone
        await store.write([make_record("d", 5)], [], full=True)
        assert checkpoint_files(tmp_path) == ["ckpt-000000000006.bin"]
        assert [r.stream for r in await store.load_all()] == ["d"]
        await store.write([make_record("e", 6)], [])
        await store.close()
        assert sorted(await load(tmp_path)) == ["d", "e"]

        # a full write of nothing: every stream gone
        store = dir_store(tmp_path)
        await store.start(SERVER)
        await store.write([], [], full=True)
        await store.close()
        assert checkpoint_files(tmp_path) == ["ckpt-000000000008.bin"]
        assert await load(tmp_path) == {}

    run(main())


def test_dir_full_file_stands_alone_when_older_files_remain(tmp_path):
    """A crash between a full file's rename and the older files' deletion
    leaves them: load_all still reads only the full file and what follows."""
    async def main():
        store = dir_store(tmp_path)
        await store.start(SERVER)
        await store.write([make_record("a", 1)], [])
        kept = tmp_path / "ckpt-000000000001.bin"
        saved = kept.read_bytes()
        await store.write([make_record("b", 2)], [], full=True)
        await store.write([make_record("c", 3)], [])
        await store.close()
        kept.write_bytes(saved)
        assert sorted(await load(tmp_path)) == ["b", "c"]

    run(main())


def test_dir_one_live_server(tmp_path):
    async def main():
        first, second = dir_store(tmp_path), dir_store(tmp_path)
        await first.start(SERVER)
        with pytest.raises(StoreError, match=f"is held by pid {os.getpid()}"):
            await second.start(SERVER)
        await first.write([make_record("a", 1)], [])
        await first.close()
        await second.start(SERVER)
        assert [r.stream for r in await second.load_all()] == ["a"]
        await second.close()

    run(main())


def test_dir_unstarted_store_and_another_models_files(tmp_path):
    async def main():
        store = dir_store(tmp_path)
        with pytest.raises(RuntimeError, match="call start"):
            await store.write([make_record("a", 1)], [])
        await store.start(SERVER)
        await store.write([make_record("a", 1)], [])
        await store.close()
        with pytest.raises(StoreError, match="ckpt-000000000001.bin is unreadable: it holds "
                                             "checkpoints of another model"):
            await load(tmp_path, "model-b")
        (tmp_path / "ckpt-000000000002.bin").write_bytes(b"FLND\x01\x00")
        with pytest.raises(StoreError, match="ckpt-000000000002.bin is unreadable: it ends"):
            await load(tmp_path)

    run(main())


def test_dir_leftover_temporary_files(tmp_path):
    async def main():
        store = dir_store(tmp_path)
        await store.start(SERVER)
        await store.write([make_record("a", 1)], [])
        await store.close()
        (tmp_path / "ckpt-000000000002.bin.tmp").write_bytes(b"FLND torn")
        (tmp_path / "notes.txt").write_text("not the store's")
        got = await load(tmp_path)
        assert list(got) == ["a"]
        assert sorted(os.listdir(tmp_path)) == ["ckpt-000000000001.bin", "lock", "notes.txt"]

    run(main())


def test_dir_full_disk_leaves_nothing_half_written(tmp_path, monkeypatch):
    written = directory._write_all

    def half_then_enospc(fd, data):
        written(fd, data[:len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    async def main():
        store = dir_store(tmp_path)
        await store.start(SERVER)
        await store.write([make_record("a", 1)], [])
        with monkeypatch.context() as m:
            m.setattr(directory, "_write_all", half_then_enospc)
            for full in (False, True):
                with pytest.raises(StoreError, match="No space left on device") as e:
                    await store.write([make_record("a", 2), make_record("b", 2)], ["c"],
                                      full=full)
                assert isinstance(e.value, OSError)
                assert isinstance(e.value.__cause__, OSError)
                assert e.value.__cause__.errno == errno.ENOSPC
                assert checkpoint_files(tmp_path) == ["ckpt-000000000001.bin"]
        assert {r.stream: r.t for r in await store.load_all()} == {"a": 1}
        await store.write([make_record("b", 3)], [])   # the disk has room again
        assert checkpoint_files(tmp_path) == ["ckpt-000000000001.bin", "ckpt-000000000002.bin"]
        await store.close()
        assert {s: r.t for s, r in (await load(tmp_path)).items()} == {"a": 1, "b": 3}

    run(main())


# a server that checkpoints 16 streams of 2 x 32768 float32 (4 MiB a write) as
# fast as it can, every third write a full one, printing each t once durable
_WRITER = r"""
import asyncio, sys
import numpy as np
from fastln.serve.store import DirStore, Record, ServerInfo

async def main():
    store = DirStore(sys.argv[1], "model-k", [np.float32, np.float32], (1, 1, 32768))
    await store.start(ServerInfo("child", None, 5.0))
    for t in range(1, 10**6):
        state = [np.full((1, 1, 32768), t, np.float32)] * 2
        records = [Record(f"s{i}", t, bytes(32), state) for i in range(16)]
        await store.write(records, [], full=t % 3 == 0)
        print(t, flush=True)

asyncio.run(main())
"""


def test_dir_kill9_mid_write_leaves_a_whole_checkpoint(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = package_parent() + os.pathsep + env.get("PYTHONPATH", "")
    rng = np.random.default_rng(0)
    torn = 0
    for _ in range(4):
        child = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path)], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            first = child.stdout.readline()
            assert first == "1\n", child.stderr.read()
            time.sleep(rng.uniform(0.0, 0.3))
        finally:
            child.kill()
        out, err = child.communicate()
        assert child.returncode == -signal.SIGKILL, err
        durable = int((first + out).split()[-1])
        torn += any(n.endswith(".tmp") for n in os.listdir(tmp_path))

        async def load_written():
            store = DirStore(tmp_path, "model-k", [F32, F32], (1, 1, 32768))
            await store.start(SERVER)
            try:
                return await store.load_all()
            finally:
                await store.close()

        records = run(load_written())
        assert sorted(r.stream for r in records) == sorted(f"s{i}" for i in range(16))
        ts = {r.t for r in records}
        # one whole write: the last one printed, or the next if its rename was done
        assert len(ts) == 1 and ts <= {durable, durable + 1}, (ts, durable)
        t = ts.pop()
        assert all((a == t).all() for r in records for a in r.state)
    print(f"{torn} of 4 kills left a temporary file")


# ---- the Redis store ----------------------------------------------------------------

class RedisServer:
    """A redis-server on 127.0.0.1 without persistence, in folder; stop()
    kills it (SIGKILL), start() starts it again on the same port."""

    def __init__(self, binary, folder):
        self.binary, self.folder, self.port = binary, folder, free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = None

    def start(self):
        log = open(os.path.join(self.folder, "redis.log"), "ab")
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.folder], stdout=log, stderr=log)
        log.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.02)
        raise AssertionError(f"redis-server did not start:\n{self.log()}")

    def stop(self):
        self.proc.kill()
        self.proc.wait()

    def log(self):
        with open(os.path.join(self.folder, "redis.log"), encoding="utf-8",
                  errors="replace") as f:
            return f.read()[-3000:]


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    require("redis")
    binary = shutil.which("redis-server") or next(
        (p for p in ("/usr/bin/redis-server", "/usr/local/bin/redis-server")
         if os.access(p, os.X_OK)), None)
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed: CI installs Debian's")
        pytest.skip("redis-server is not installed")
    server = RedisServer(binary, str(tmp_path_factory.mktemp("redis")))
    server.start()
    yield server
    server.stop()


class Listener:
    """A TCP port that accepts connections (a live server's ws address), or
    refuses them once closed (a dead one's)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.address = "127.0.0.1:%d" % self.sock.getsockname()[1]

    def close(self):
        self.sock.close()


async def redis_store(url, server, fingerprint):
    store = open_store(url, fingerprint, dtypes=DTYPES, shape=SHAPE)
    await store.start(server)
    return store


def new_fingerprint():
    return uuid.uuid4().hex   # a namespace of keys for one test


def test_redis_fenced_writes_ownership_and_release(redis_server):
    async def main():
        fp = new_fingerprint()
        a = await redis_store(redis_server.url, ServerInfo("A", None, 5.0), fp)
        b = await redis_store(redis_server.url, ServerInfo("B", None, 5.0), fp)
        assert a.shared and await a.load_all() == []
        assert await b.write([make_record("s1", 1)], []) == []
        assert await a.write([make_record("s1", 2), make_record("s2", 2)], []) == ["s1"]
        assert await a.write([], ["s1", "s2"]) == ["s1"]   # removals are fenced too
        assert await a.write([make_record("s2", 3)], []) == []
        assert await a.write([make_record("s2", 2)], []) == []   # older than the stored
        assert same(await a.take("s2", 0), make_record("s2", 3))
        # owned: what no other server owns (s3 has no owner)
        assert await a.owned(["s1", "s2", "s3"]) == ["s2", "s3"]
        assert await b.owned(["s1", "s2", "s3"]) == ["s1", "s3"]
        got = await b.take("s1", 0)
        assert same(got, make_record("s1", 1))   # A's refused write changed nothing
        await b.release(["s1", "s2"])            # releases only what B owns
        assert await b.owned(["s1"]) == ["s1"] and await a.owned(["s2"]) == ["s2"]
        assert await b.owned(["s2"]) == []
        assert same(await a.take("s1", 0), make_record("s1", 1))
        assert await a.owned(["s1", "s2"]) == ["s1", "s2"]
        assert await b.write([make_record("s1", 4)], []) == ["s1"]
        for store in (a, b):
            await store.close()

    run(main())


def test_redis_take(redis_server):
    async def main():
        fp, url = new_fingerprint(), redis_server.url
        live, dead = Listener(), Listener()
        dead.close()
        a = await redis_store(url, ServerInfo("A", live.address, 5.0), fp)
        d = await redis_store(url, ServerInfo("D", dead.address, 5.0), fp)
        e = await redis_store(url, ServerInfo("E", live.address, 0.3), fp)
        b = await redis_store(url, ServerInfo("B", None, 5.0), fp)
        for store, sid in ((a, "of-a"), (d, "of-d"), (e, "of-e")):
            assert await store.renew()
            assert await store.write([make_record(sid, 7)], []) == []
        assert await b.take("nothing", 1.0) is None

        # its own stream: at once
        assert same(await a.take("of-a", 0), make_record("of-a", 7))

        # a live owner (its lease alive, its port listening): Held after wait
        start = time.monotonic()
        with pytest.raises(Held) as held:
            await b.take("of-a", 0.4)
        assert 0.4 <= time.monotonic() - start < 1.5
        assert held.value.owner == "A" and 4.0 < held.value.retry_after <= 5.0
        assert await a.owned(["of-a"]) == ["of-a"]

        # an owner whose lease lives but whose port refuses (killed): taken at once
        start = time.monotonic()
        assert same(await b.take("of-d", 5.0), make_record("of-d", 7))
        assert time.monotonic() - start < 0.5
        assert await d.owned(["of-d"]) == [] and await b.owned(["of-d"]) == ["of-d"]
        assert await d.write([make_record("of-d", 8)], []) == ["of-d"]

        # an owner whose lease expires while the take waits: taken then
        await e.renew()   # it expired during the waits above: made again
        start = time.monotonic()
        assert same(await b.take("of-e", 3.0), make_record("of-e", 7))
        assert 0.1 < time.monotonic() - start < 1.0
        assert await e.owned(["of-e"]) == []

        # a stream that no server owns (released): at once
        await a.release(["of-a"])
        assert same(await b.take("of-a", 0), make_record("of-a", 7))

        # an expired lease: at once, even with wait=0
        assert await e.write([make_record("of-e2", 1)], []) == []
        await asyncio.sleep(0.4)
        assert same(await b.take("of-e2", 0), make_record("of-e2", 1))
        for store in (a, d, e, b):
            await store.close()
        live.close()

    run(main())


def test_redis_leases(redis_server):
    async def main():
        fp = new_fingerprint()
        a = await redis_store(redis_server.url, ServerInfo("A", "127.0.0.1:1", 0.3), fp)
        assert await a.renew() and await a.renew()
        await asyncio.sleep(0.45)
        assert not await a.renew()   # expired: made again, so the next one holds
        assert await a.renew()
        # a second live server with A's id
        twin = await redis_store(redis_server.url, ServerInfo("A", None, 0.3), fp)
        with pytest.raises(StoreError, match="another live server has this id"):
            await twin.renew()
        await a.close()   # deletes A's lease
        assert await twin.renew()
        await twin.close()

    run(main())


def test_redis_chunked_writes(redis_server):
    async def main():
        fp = new_fingerprint()
        a = await redis_store(redis_server.url, ServerInfo("A", None, 5.0), fp)
        b = await redis_store(redis_server.url, ServerInfo("B", None, 5.0), fp)
        records = [make_record(f"s{i}", i) for i in range(2000)]
        ids = [r.stream for r in records]
        assert await a.renew()
        assert await a.write(records, []) == []
        assert await b.write(records[::-1], []) == ids[::-1]
        assert await a.owned(ids) == ids and await b.owned(ids) == []
        with pytest.raises(Held):
            await b.take("s1999", 0)
        await a.release(ids)
        assert await a.owned(ids) == ids == await b.owned(ids)   # no owner now
        assert same(await b.take("s1999", 0), records[1999])
        assert await b.write([], ids) == []   # B owns s1999; the others have no owner
        assert await b.take("s1999", 0) is None and await b.take("s0", 0) is None
        for store in (a, b):
            await store.close()

    run(main())


def test_redis_outage_fails_fast_and_recovers(redis_server):
    async def main():
        fp = new_fingerprint()
        a = await redis_store(redis_server.url, ServerInfo("A", None, 5.0), fp)
        assert await a.renew() and await a.write([make_record("s", 1)], []) == []
        for outage in ("killed", "paused"):
            if outage == "killed":
                redis_server.stop()
            else:
                os.kill(redis_server.proc.pid, signal.SIGSTOP)
            try:
                calls = [lambda: a.write([make_record("s", 2)], []), a.renew]
                if outage == "killed":   # each call of a paused Redis times out
                    calls += [lambda: a.take("s", 5.0), lambda: a.owned(["s"]),
                              lambda: a.release(["s"])]
                for call in calls:
                    start = time.monotonic()
                    with pytest.raises(StoreError, match="failed in RedisStore"):
                        await call()
                    assert time.monotonic() - start < 1.2, outage
            finally:
                if outage == "killed":
                    redis_server.start()   # empty: it keeps nothing
                else:
                    os.kill(redis_server.proc.pid, signal.SIGCONT)
            # working again: the scripts are loaded again where Redis lost them; the
            # write that timed out in the paused Redis ran when it resumed, but never
            # over a later one
            assert await a.write([make_record("s", 3)], []) == []
            assert same(await a.take("s", 0), make_record("s", 3))
            assert await a.renew() == (outage == "paused")   # a killed Redis lost it
            await asyncio.sleep(0.1)
            assert same(await a.take("s", 0), make_record("s", 3))
        await a.close()

    run(main())


def test_redis_start_needs_no_redis_and_models_keep_apart(redis_server):
    import redis

    async def main():
        down = await redis_store(f"redis://127.0.0.1:{free_port()}/0",
                                 ServerInfo("A", None, 5.0), new_fingerprint())
        with pytest.raises(StoreError, match="ConnectionError"):
            await down.write([make_record("s", 1)], [])
        await down.close()

        one, two = new_fingerprint(), new_fingerprint()
        a = await redis_store(redis_server.url, ServerInfo("A", None, 5.0), one)
        b = await redis_store(redis_server.url, ServerInfo("B", None, 5.0), two)
        assert await a.write([make_record("s", 1)], []) == []
        assert await b.take("s", 0) is None
        assert await b.write([make_record("s", 2)], []) == []   # its own namespace
        assert same(await a.take("s", 0), make_record("s", 1))
        client = redis.asyncio.Redis.from_url(redis_server.url)
        keys = {k.decode() for k in await client.keys("fastln:*")}
        await client.aclose()
        assert {f"fastln:{one[:16]}:s:s", f"fastln:{one[:16]}:o:s", f"fastln:{two[:16]}:s:s",
                f"fastln:{two[:16]}:o:s"} <= keys
        assert not any(k.startswith(f"fastln:{one[:16]}:") and k.endswith(("B", ":s:s2"))
                       for k in keys)
        for store in (a, b):
            await store.close()

    run(main())


# ---- open_store ---------------------------------------------------------------------

def test_open_store_names_bad_arguments(tmp_path):
    assert isinstance(open_store(tmp_path, "fp", dtypes=DTYPES, shape=SHAPE), DirStore)
    for url, match in (("http://host:1/0", "its scheme is 'http'"),
                       ("redis://:6379/0", "it names no host"),
                       ("redis://host:99999/0", "its port is not a number"),
                       ("redis://host:port/0", "its port is not a number"),
                       ("redis://host:0/0", "its port is not a number"),
                       ("redis://host:6379/zero", "its database 'zero' is not a number"),
                       ("redis://host:6379?db=x", "its database 'x' is not a number"),
                       ("unix://", "it names no socket path")):
        with pytest.raises(ValueError, match="url_or_dir .* is not a Redis URL: " + match):
            open_store(url, "fp", dtypes=DTYPES, shape=SHAPE)
    with pytest.raises(TypeError, match="url_or_dir must be"):
        open_store(None, "fp", dtypes=DTYPES, shape=SHAPE)
    with pytest.raises(ValueError, match="fingerprint must be a non-empty str"):
        open_store(tmp_path, "", dtypes=DTYPES, shape=SHAPE)
    with pytest.raises(TypeError, match="fingerprint must be a str, got bytes"):
        open_store(tmp_path, b"fp", dtypes=DTYPES, shape=SHAPE)
    with pytest.raises(TypeError, match="dtypes must be a non-empty sequence"):
        open_store(tmp_path, "fp", dtypes="float32", shape=SHAPE)
    with pytest.raises(TypeError, match="shape must be a sequence of non-negative ints"):
        open_store(tmp_path, "fp", dtypes=DTYPES, shape=(2, 1, -1))


def test_open_store_makes_redis_stores():
    require("redis")
    from fastln.serve.store.redis import RedisStore

    for url in ("redis://127.0.0.1:6379/2", "rediss://cache.example:6380",
                "unix:///run/redis.sock?db=1"):
        store = open_store(url, "0123456789abcdef-and-more", dtypes=DTYPES, shape=SHAPE)
        assert isinstance(store, RedisStore) and store.shared
        assert store.prefix == "fastln:0123456789abcdef:"
    store = open_store("redis://user:secret@127.0.0.1:6379/0", "fp", dtypes=DTYPES, shape=SHAPE)
    assert "secret" not in repr(store) and "user:***@127.0.0.1" in repr(store)
