"""The processes a load test runs beside the servers: nginx, from the
documentation's configuration, and redis-server, the checkpoint store of
``fastln-serve --checkpoint-store``. tests/test_nginx.py and
tests/test_serve_crash.py run them too.
"""
import contextlib
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import tempfile
import time


def binary(name, *places):
    """The path of the program name (on PATH, or at one of places), or None."""
    return shutil.which(name) or next((p for p in places if os.access(p, os.X_OK)), None)


def free_port():
    """A TCP port of 127.0.0.1 that is free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid):
    """{pid: command line} of the processes whose parent is pid."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    found[int(entry)] = f.read().replace(b"\0", b" ").decode().strip()
        except (OSError, ValueError, IndexError):
            continue         # it exited meanwhile
    return found


class Nginx:
    """nginx in a prefix of its own (prefix/nginx.conf includes conf, the
    docs' fastln.conf, copied with the listen port and the log folder
    changed, and prefix/fastln/upstream.conf lists the servers), in the
    foreground as this process's child; ``nginx -s reload`` finds it by its
    pid file in the prefix."""

    def __init__(self, binary, prefix, conf):
        self.binary, self.prefix, self.conf = binary, str(prefix), conf
        self.proc, self.port = None, None
        for folder in ("fastln", "logs", "tmp"):
            os.makedirs(os.path.join(self.prefix, folder), exist_ok=True)
        self.error_log = os.path.join(self.prefix, "logs", "error.log")
        self.upstream_file = os.path.join(self.prefix, "fastln", "upstream.conf")
        tmp = os.path.join(self.prefix, "tmp")
        with open(os.path.join(self.prefix, "nginx.conf"), "w") as f:
            # two connections per stream, and a few more: under the hard limit of open files
            files = min(4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
            f.write(f"worker_processes 1;\n"
                    f"pid {self.prefix}/nginx.pid;\n"
                    f"worker_rlimit_nofile {files};\n"
                    f"events {{ worker_connections {files - 64}; }}\n"
                    "http {\n"
                    + "".join(f"    {kind}_temp_path {tmp}/{kind};\n"
                              for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
                    + "    include fastln.conf;\n}\n")

    def configure(self, port):
        """Copies the docs' fastln.conf with listen 127.0.0.1:port and the logs in the prefix."""
        with open(self.conf, encoding="utf-8") as f:
            text = f.read()
        for pattern in (r"listen 80;", r"/var/log/nginx/"):
            if len(re.findall(pattern, text)) != 1:
                raise ValueError(f"{self.conf} should hold {pattern!r} once")
        text = text.replace("listen 80;", f"listen 127.0.0.1:{port};")
        text = text.replace("/var/log/nginx/", os.path.join(self.prefix, "logs") + "/")
        with open(os.path.join(self.prefix, "fastln.conf"), "w", encoding="utf-8") as f:
            f.write(text)
        self.port = port

    def upstream(self, servers, options="max_fails=0"):
        """Writes fastln/upstream.conf as docs/nginx/upstream.conf does: the
        servers' WebSocket addresses (fastln servers, each with options), or
        lines as they are (str)."""
        with open(self.upstream_file, "w") as f:
            for server in servers:
                f.write(server + "\n" if isinstance(server, str) else
                        f"server {server.ws.removeprefix('ws://')} {options};\n")

    def command(self, *args):
        return [self.binary, "-p", self.prefix + "/", "-e", self.error_log,
                "-c", os.path.join(self.prefix, "nginx.conf"), *args]

    def check(self):
        run_ = subprocess.run(self.command("-t"), capture_output=True, text=True, timeout=30)
        if run_.returncode != 0:
            raise RuntimeError(f"nginx -t failed:\n{run_.stderr}\n{self.log()}")

    def start(self, tries=3):
        for _ in range(tries):
            self.configure(free_port())
            self.check()
            self.proc = subprocess.Popen(self.command("-g", "daemon off;"),
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 10
            while self.proc.poll() is None and time.monotonic() < deadline:
                with contextlib.suppress(OSError), socket.create_connection(
                        ("127.0.0.1", self.port), timeout=1):
                    if self.workers()[0]:
                        return
                time.sleep(0.05)
            self.stop()
            if "Address already in use" not in self.log():
                break            # another port will not help
        raise RuntimeError(f"nginx did not start:\n{self.log()}")

    def workers(self):
        """(pids of the workers that take connections, pids of those shutting down)."""
        procs = children(self.proc.pid)
        return ({p for p, cmd in procs.items() if cmd.endswith("worker process")},
                {p for p, cmd in procs.items() if cmd.endswith("is shutting down")})

    def reload(self):
        """``nginx -s reload``, as the guide says: it signals the master and
        returns; the old workers take connections for a while yet."""
        self.check()
        run_ = subprocess.run(self.command("-s", "reload"), capture_output=True, text=True,
                              timeout=30)
        if run_.returncode != 0:
            raise RuntimeError(f"nginx -s reload failed:\n{run_.stderr}\n{self.log()}")

    def reload_and_wait(self, timeout=30):
        """Reloads the configuration and waits until only the new worker
        takes connections: the old ones have closed their listening sockets
        and serve just the connections they hold."""
        old, _ = self.workers()
        self.reload()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            taking, _ = self.workers()
            if taking and not taking & old:
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"nginx exited:\n{self.log()}")
            time.sleep(0.02)
        raise RuntimeError(f"nginx did not reload within {timeout} s:\n{self.log()}")

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()    # SIGTERM: a fast shutdown
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log(self):
        try:
            with open(self.error_log, encoding="utf-8", errors="replace") as f:
                return f.read()[-5000:]
        except OSError:
            return "(no error log)"

    @property
    def http(self):
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self):
        return f"ws://127.0.0.1:{self.port}"


class RedisServer:
    """Debian's redis-server on 127.0.0.1, in a folder of its own, without
    persistence (it is a test's store): :meth:`start`, :meth:`stop` (which
    keeps its port, so that a restart is the same address: an outage),
    :meth:`kill` (SIGKILL) and :attr:`url`, the --checkpoint-store URL."""

    def __init__(self, path, port=None):
        self.path, self.port = path, port or free_port()
        self.folder = tempfile.mkdtemp(prefix="fastln-redis-")
        self.proc = None

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout=10.0):
        """Starts the server and waits until it answers PING."""
        self.proc = subprocess.Popen(
            [self.path, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.folder, "--protected-mode", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            with contextlib.suppress(OSError), socket.create_connection(
                    ("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return self
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port}")

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self):
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)
