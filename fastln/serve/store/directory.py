"""The directory store, :class:`DirStore`: one server's checkpoints in a
directory of its machine.

The directory holds ``lock``, which the live server holds an exclusive
``flock`` on (the kernel frees it when the process dies, even by kill -9),
and checkpoint files ``ckpt-<generation>.bin``, one per :meth:`DirStore.write`:
the records of that call and the ids it removed. A file is written under a
temporary name (``.tmp``), fsync'd, renamed to its own and the directory
fsync'd, so that a crash leaves every earlier file whole and never a torn
one; a temporary file left by a crash is deleted at start. Reading the files
in generation order, a later record or removal wins; a full write
(``full=True``) makes a file that stands alone, and the older files are
deleted. The file work runs in a thread (``asyncio.to_thread``), never on
the event loop, one operation at a time.

A file's layout, little-endian: magic ``b"FLND"``, version u16, full u8,
the model's fingerprint (u16 length, UTF-8), the number of removed ids u32
and of records u32, each removed id (u16 length, UTF-8), each record (u32
length, :func:`~fastln.serve.store.record.encode`'s bytes).
"""
from __future__ import annotations

import asyncio
import errno
import os
import re
import struct
import threading

from .base import Store, StoreError
from .record import decode, encode

MAGIC = b"FLND"
VERSION = 1
_HEAD = struct.Struct("<4sHBH")   # magic, version, full, fingerprint length
_COUNTS = struct.Struct("<II")    # removed ids, records
_U16, _U32 = struct.Struct("<H"), struct.Struct("<I")
_FILE = re.compile(r"ckpt-(\d{12})\.bin")
_TEMP = re.compile(r"ckpt-\d{12}\.bin\.tmp")


class DirStore(Store):
    """The checkpoints of one server in a directory (see the module).

    Parameters
    ----------
    path : str or os.PathLike
        The directory; made where it does not exist.
    fingerprint : str
        The model's fingerprint: files of another model are refused.
    dtypes : sequence of numpy dtypes
        The dtypes of a stream's state arrays.
    shape : sequence of int
        The shape of each state array.
    """

    shared = False

    def __init__(self, path, fingerprint: str, dtypes, shape):
        super().__init__(fingerprint, dtypes, shape)
        self.path = os.fspath(path)
        self._lock_fd = None
        self._generation = 0   # the newest file's
        # one file operation at a time, held in the thread: a cancelled call's
        # operation runs to its end before the next starts
        self._mutex = threading.Lock()

    def __repr__(self):
        return f"DirStore({self.path!r})"

    async def _in_thread(self, work, *args):
        def serial():
            with self._mutex:
                return work(*args)

        return await asyncio.to_thread(serial)

    async def start(self, server):
        """Locks the directory (creating it where missing); a second live server on it is a
        StoreError."""
        await self._in_thread(self._start)

    async def load_all(self):
        """Every stream of the directory's checkpoint files, later ones winning."""
        return await self._in_thread(self._load_all)

    async def write(self, records, removed, full=False):
        """Writes one checkpoint file (all of it, or nothing); refuses nothing."""
        await self._in_thread(self._write, list(records), list(removed), full)
        return []

    async def release(self, ids):
        """Nothing: one server has the directory."""

    async def take(self, stream, wait):
        """None: a start loads every stream of the directory, and no other server takes one."""
        return None

    async def renew(self):
        """True: the directory's lock, not a lease, keeps it one server's."""
        return True

    async def owned(self, ids):
        """Every one of ids: no other server writes the directory."""
        return list(ids)

    async def close(self):
        """Frees the directory's lock."""
        await self._in_thread(self._close)

    # ---- the file work, in a thread ------------------------------------------------------

    def _start(self):
        # POSIX alone has it: imported here, so that the module imports everywhere
        import fcntl

        if self._lock_fd is not None:
            raise RuntimeError(f"{self!r} is started already")
        lock = os.path.join(self.path, "lock")
        try:
            os.makedirs(self.path, exist_ok=True)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise StoreError(f"cannot open the checkpoint directory's lock {lock}: {e}") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.read(fd, 32).decode("ascii", "replace").strip() or "?"
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise StoreError(f"the checkpoint directory {self.path} is held by pid "
                                 f"{holder}") from e
            raise StoreError(f"cannot lock {lock}: {e}") from e
        self._lock_fd = fd
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            generations = []
            for name in os.listdir(self.path):
                if _TEMP.fullmatch(name):      # a write that a crash cut short
                    os.unlink(os.path.join(self.path, name))
                elif _FILE.fullmatch(name):
                    generations.append(int(name[5:17]))
            self._generation = max(generations, default=0)
        except OSError as e:
            self._close()
            raise StoreError(f"cannot read the checkpoint directory {self.path}: {e}") from e

    def _close(self):
        if self._lock_fd is not None:
            os.close(self._lock_fd)   # frees the flock
            self._lock_fd = None

    def _check_started(self):
        if self._lock_fd is None:
            raise RuntimeError(f"{self!r} is not started: call start() first")

    def _files(self):
        """The checkpoint files' (generation, path), oldest first."""
        names = sorted(n for n in os.listdir(self.path) if _FILE.fullmatch(n))
        return [(int(n[5:17]), os.path.join(self.path, n)) for n in names]

    def _load_all(self):
        self._check_started()
        streams = {}
        try:
            files = self._files()
        except OSError as e:
            raise StoreError(f"cannot list the checkpoint directory {self.path}: {e}") from e
        for _, path in files:
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError as e:
                raise StoreError(f"cannot read the checkpoint file {path}: {e}") from e
            try:
                full, removed, records = self._parse(data)
            except ValueError as e:
                raise StoreError(f"the checkpoint file {path} is unreadable: {e}") from e
            if full:
                streams.clear()
            for sid in removed:
                streams.pop(sid, None)
            for record in records:
                streams[record.stream] = record
        return list(streams.values())

    def _parse(self, data):
        """(full, removed ids, records) of a checkpoint file's bytes."""
        view = memoryview(data)
        magic, version, full, size = _unpack(_HEAD, view, 0)
        if magic != MAGIC:
            raise ValueError(f"its magic is {bytes(magic)!r}, not {MAGIC!r}")
        if version != VERSION:
            raise ValueError(f"version {version}; this fastln reads version {VERSION}")
        at = _HEAD.size
        fingerprint = _text(view, at, size)
        if fingerprint != self.fingerprint:
            raise ValueError(f"it holds checkpoints of another model (fingerprint "
                             f"{fingerprint!r}, not {self.fingerprint!r})")
        at += size
        n_removed, n_records = _unpack(_COUNTS, view, at)
        at += _COUNTS.size
        removed, records = [], []
        for _ in range(n_removed):
            (size,) = _unpack(_U16, view, at)
            removed.append(_text(view, at + _U16.size, size))
            at += _U16.size + size
        for _ in range(n_records):
            (size,) = _unpack(_U32, view, at)
            at += _U32.size
            if at + size > len(view):
                raise ValueError(f"it ends within a record, at byte {len(view)}")
            records.append(decode(view[at:at + size], self.dtypes, self.shape))
            at += size
        if at != len(view):
            raise ValueError(f"{len(view) - at} bytes follow its last record")
        return bool(full), removed, records

    def _write(self, records, removed, full):
        self._check_started()
        if not records and not removed and not full:
            return
        data = self._file_bytes(records, removed, full)
        generation = self._generation + 1
        path = os.path.join(self.path, f"ckpt-{generation:012d}.bin")
        temp = path + ".tmp"
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(temp, path)
        except OSError as e:
            try:
                os.unlink(temp)
            except FileNotFoundError:
                pass
            except OSError as e2:
                raise StoreError(f"cannot write {path} ({e}), nor delete {temp}: {e2}") from e
            raise StoreError(f"cannot write the checkpoint file {path}: {e}") from e
        self._generation = generation
        try:
            _fsync_dir(self.path)   # the rename is durable
            if full:                # this file stands alone: the older ones go
                for older, older_path in self._files():
                    if older < generation:
                        os.unlink(older_path)
                _fsync_dir(self.path)
        except OSError as e:
            raise StoreError(f"wrote {path}, but cannot sync or compact the checkpoint "
                             f"directory: {e}") from e

    def _file_bytes(self, records, removed, full):
        fingerprint = self.fingerprint.encode("utf-8")
        parts = [_HEAD.pack(MAGIC, VERSION, bool(full), len(fingerprint)), fingerprint,
                 _COUNTS.pack(len(removed), len(records))]
        for sid in removed:
            raw = sid.encode("utf-8")
            parts += [_U16.pack(len(raw)), raw]
        for record in records:
            blob = encode(record)
            parts += [_U32.pack(len(blob)), blob]
        return b"".join(parts)


def _write_all(fd, data):
    """Writes all of data to fd (os.write may write less than it is given)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unpack(layout, view, at):
    if at + layout.size > len(view):
        raise ValueError(f"it ends at byte {len(view)}, within its header")
    return layout.unpack_from(view, at)


def _text(view, at, size):
    if at + size > len(view):
        raise ValueError(f"it ends at byte {len(view)}, within a name")
    try:
        return bytes(view[at:at + size]).decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"a name at byte {at} is not UTF-8") from None
