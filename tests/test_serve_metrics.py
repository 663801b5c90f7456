"""fastln-serve's observability: ``GET /metrics`` and the health probes.

1. After known traffic (steps over WebSocket, refusals of each kind, an
   idle stream ended), /metrics reports exactly those counts: steps,
   batches and the batch-size histogram agree, rejections and evictions by
   reason, the delay and latency histograms count every step, the model's
   info carries its configuration and fingerprint.
2. Debian's ``promtool check metrics`` finds nothing to say about it (skipped
   where promtool is not installed; a failure under CI, which installs it).
3. /health/live and /health/ready on both ports: ready is 503 with the
   reason while the table is full, 200 again once a stream leaves.
"""
import asyncio
import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request

import numpy as np
import pytest

from fastln.rnn import LNLSTM

from _util import require

for _name in ("picows", "starlette", "uvicorn", "prometheus_client"):
    require(_name)

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from test_serve import refused, run  # noqa: E402

from fastln.serve.client import StreamClient, request, run_server  # noqa: E402
from fastln.serve.errors import REASON_NAMES  # noqa: E402
from fastln.serve.model import save_model  # noqa: E402

I, H = 8, 16


@pytest.fixture
def model_file(tmp_path):
    path = str(tmp_path / "m.npz")
    save_model(path, LNLSTM(I, H, seed=4))
    return path


def get(url):
    """(status, body text, content type) of a GET."""
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode(), r.headers["Content-Type"]
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), e.headers["Content-Type"]


def samples(text):
    """{(name, frozenset of labels): value} of an exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name, frozenset(s.labels.items())] = s.value
    return out


def traffic(url):
    """12 steps on 3 streams, then one refusal of each kind below, and a
    stream left idle; returns the codes of the refusals."""
    async def main():
        clients = [await StreamClient.connect(url, f"s{k}", new=True) for k in range(3)]
        for k in range(4):
            await asyncio.gather(*(c.step(np.full(I, k, np.float32)) for c in clients))
        closes = [await refused(url, "s0", new=True),                # conflict
                  await refused(url, "nobody", token="x" * 32),      # not_found
                  await refused(url, "idle", new=True)]              # table_full (capacity 3)
        await clients[0].close(1001)                                 # s0 waits, then idles out
        closes += [await refused(url, "s0"),                         # no_token
                   await refused(url, "s0", token="y" * 32)]         # wrong_token
        bad = await StreamClient.connect(url, "s0", token=clients[0].token)
        bad.send_frame(b"\0" * 3)                                    # bad_frame
        await asyncio.wait_for(bad._peer.transport.wait_disconnected(), 10)
        assert bad.closed.code == 1007
        for c in clients[1:]:
            await c.close()
        return [e.code for e in closes]
    return run(main())


def test_metrics_count_what_happened(model_file):
    with run_server("--model", model_file, "--capacity", 3, "--idle-timeout", 0.3) as server:
        codes = traffic(server.ws)
        # s0 ends after --idle-timeout with no connection (the sweep runs every
        # idle-timeout / 4)
        for _ in range(100):
            status, text, ctype = get(f"{server.http}/metrics")
            if samples(text)[("fastln_serve_evictions_total",
                              frozenset({("reason", "idle_timeout")}))] == 1:
                break
            asyncio.run(asyncio.sleep(0.05))
        health = server.health()
    assert codes == [4409, 4404, 1013, 4401, 4403]
    assert status == 200 and ctype.startswith("text/plain; version="), ctype
    m = samples(text)

    def one(name, **labels):
        return m[name, frozenset(labels.items())]

    assert one("fastln_serve_steps_total") == 12 == health["steps"]
    assert one("fastln_serve_streams") == 0 and one("fastln_serve_capacity") == 3
    assert one("fastln_serve_connections") == 0 and one("fastln_serve_draining") == 0
    batches = one("fastln_serve_batches_total")
    assert batches == health["batcher"]["batches"] and 4 <= batches <= 12
    assert one("fastln_serve_batch_size_count") == batches
    assert one("fastln_serve_batch_size_sum") == 12
    assert one("fastln_serve_batch_size_bucket", le="+Inf") == batches
    for name in ("queue_delay_seconds", "step_latency_seconds"):
        assert one(f"fastln_serve_{name}_count") == 12
        assert one(f"fastln_serve_{name}_bucket", le="+Inf") == 12
    assert one("fastln_serve_step_latency_seconds_sum") >= one(
        "fastln_serve_queue_delay_seconds_sum") > 0
    want = {r: 0 for r in REASON_NAMES}
    want.update(conflict=1, not_found=1, table_full=1, no_token=1, wrong_token=1, bad_frame=1)
    assert {r: one("fastln_serve_rejections_total", reason=r) for r in REASON_NAMES} == want
    assert one("fastln_serve_evictions_total", reason="idle_timeout") == 1
    info = next(labels for (name, labels) in m if name == "fastln_serve_model_info")
    info = dict(info)
    assert info["class"] == "LNLSTM" and info["hidden_size"] == str(H)
    assert len(info["fingerprint"]) == 64
    assert one("process_cpu_seconds_total") > 0


@pytest.mark.parametrize("checkpoints", [False, True], ids=["plain", "checkpoints"])
def test_promtool_finds_nothing(model_file, tmp_path, checkpoints):
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI"):
            pytest.fail("promtool (Debian's prometheus package) is not installed")
        pytest.skip("promtool (Debian's prometheus package) is not installed")
    more = ["--checkpoint-dir", tmp_path / "ckpt", "--checkpoint-interval", 0.05] \
        if checkpoints else []
    with run_server("--model", model_file, *more) as server:
        traffic_free = get(f"{server.http}/metrics")[1]
        run(_steps(server.ws))
        if checkpoints:      # a checkpoint every 50 ms, whether or not a stream stepped
            for _ in range(200):
                m = samples(get(f"{server.http}/metrics")[1])
                if m["fastln_serve_checkpoints_total", frozenset({("result", "ok")})] >= 2:
                    break
                asyncio.run(asyncio.sleep(0.02))
            assert m["fastln_serve_checkpoints_total", frozenset({("result", "ok")})] >= 2
            assert m["fastln_serve_store_up", frozenset()] == 1
            assert m["fastln_serve_checkpoints_total", frozenset({("result", "failed")})] == 0
            assert m["fastln_serve_checkpoint_age_seconds", frozenset()] < 60
            ready = json.loads(get(f"{server.http}/health/ready")[1])
            assert ready["ready"] and ready["store"]["ok"], ready
        after = get(f"{server.http}/metrics")[1]
    for text in (traffic_free, after):
        r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                           text=True, timeout=60, check=False)
        assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), (
            r.stdout + r.stderr)


async def _steps(url):
    async with await StreamClient.connect(url, "p", new=True) as c:
        for k in range(5):
            await c.step(np.full(I, k, np.float32))


def test_health_probes_on_both_ports(model_file):
    with run_server("--model", model_file, "--capacity", 1) as server:
        ws_http = "http://" + server.ws.split("://", 1)[1]
        for base in (server.http, ws_http):
            status, body, _ = get(f"{base}/health/live")
            assert status == 200 and json.loads(body) == {"live": True}
            status, body, _ = get(f"{base}/health/ready")
            assert status == 200 and json.loads(body) == {"ready": True}
        assert request("POST", f"{server.http}/streams", {"stream": "only"})[0] == 201
        for base in (server.http, ws_http):
            status, body, _ = get(f"{base}/health/ready")
            reply = json.loads(body)
            assert status == 503 and reply["ready"] is False, reply
            assert "full: 1 streams, --capacity 1" in reply["why"][0]
        assert request("DELETE", f"{server.http}/streams/only")[0] == 200
        assert get(f"{server.http}/health/ready")[0] == 200
