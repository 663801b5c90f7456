"""The run-time policy (src_c/runtime/policy.c): thresholds as multiples of the cache
sizes, the cache-size overrides and their parsing, the detection's fallback,
and that a call's results do not depend on the policy's choices."""
import numpy as np
import pytest

import fastln
from fastln import _lib

from _util import run_python

KiB, MiB = 1024, 1024 * 1024
REF = dict(l1=32 * KiB, l2=1 * MiB, l3=32 * MiB)       # the reference machine
BIG = dict(l1=48 * KiB, l2=2 * MiB, l3=256 * MiB)      # a server with a dedicated L3
LAPTOP = dict(l1=48 * KiB, l2=1280 * KiB, l3=8 * MiB)


def plan(kind, N, H, itemsize, isa, threads, caches=REF, shared=False):
    return _lib._policy(kind, N, H, itemsize, isa, threads, l3_shared=shared, **caches)


def threshold(kind, H, itemsize, isa, threads, caches=REF, shared=False):
    """The plan's streaming threshold for a call large enough to use threads"""
    p = plan(kind, 1 << 16, H, itemsize, isa, threads, caches, shared)
    assert p["threads"] == threads
    return p["stream_bytes"]


# (kind, H, itemsize, isa, threads) -> bytes out from which the call streams on
# a 32 MiB L3 (the thresholds the kernels were tuned with)
REFERENCE = [
    (("forward", 1024, 4, "avx512", 2), 16 * MiB),
    (("forward", 1024, 4, "avx512", 1), 8 * MiB),
    (("forward", 64, 4, "avx512", 1), 4 * MiB),
    (("forward", 128, 4, "avx512", 1), 4 * MiB),     # 512-byte rows: short
    (("forward", 129, 4, "avx512", 1), 8 * MiB),
    (("forward", 64, 4, "avx512", 2), 16 * MiB),     # float32 short rows: one thread only
    (("forward", 64, 2, "avx512", 2), 4 * MiB),      # 16-bit short rows: any threads
    (("forward", 256, 2, "avx512", 2), 4 * MiB),
    (("forward", 257, 2, "avx512", 2), 16 * MiB),
    (("forward", 1024, 2, "avx512", 1), 8 * MiB),
    (("forward", 1024, 4, "avx2", 2), 32 * MiB),
    (("forward", 64, 4, "avx2", 1), 32 * MiB),
    (("forward", 1024, 2, "generic", 1), 32 * MiB),
    (("forward", 1024, 8, "avx512", 1), 32 * MiB),   # float64
    (("forward", 64, 8, "avx512", 2), 32 * MiB),
    (("add", 64, 4, "avx512", 1), 8 * MiB),           # s and y together
    (("add", 1024, 4, "avx512", 1), 16 * MiB),
    (("add", 1024, 4, "avx512", 2), 32 * MiB),
    (("add", 64, 2, "avx512", 2), 8 * MiB),
    (("add", 1024, 2, "avx512", 2), 32 * MiB),
    (("add", 1024, 4, "avx2", 1), 32 * MiB),
    (("add", 1024, 8, "avx512", 2), 32 * MiB),
    (("backward", 128, 4, "avx512", 2), 4 * MiB),
    (("backward", 16, 4, "avx512", 1), 4 * MiB),
    (("backward", 129, 4, "avx512", 2), 8 * MiB),
    (("backward", 128, 4, "avx2", 2), 8 * MiB),
    (("backward", 128, 4, "generic", 1), 8 * MiB),
    (("backward", 64, 2, "avx512", 2), 8 * MiB),
    (("backward", 64, 8, "avx512", 2), 8 * MiB),
    (("backward", 1024, 4, "avx512", 2), 8 * MiB),
]


@pytest.mark.parametrize("call,expected", REFERENCE, ids=lambda v: str(v))
def test_reference_machine_gives_the_tuned_thresholds(call, expected):
    assert threshold(*call) == expected


@pytest.mark.parametrize("call,expected", REFERENCE, ids=lambda v: str(v))
def test_thresholds_scale_with_the_l3(call, expected):
    assert threshold(*call, caches=BIG) == expected * 8
    assert threshold(*call, caches=LAPTOP) == expected / 4


def test_stream_decision_at_the_threshold():
    # float32 forward, AVX-512, 2 threads: 16 MiB out on the reference machine
    H = 1024
    rows = 16 * MiB // (4 * H)
    assert plan("forward", rows, H, 4, "avx512", 2)["stream"]
    assert not plan("forward", rows - 1, H, 4, "avx512", 2)["stream"]
    # add + LayerNorm counts s and y: 32 MiB of them on 2 threads
    rows = 16 * MiB // (4 * H)
    assert plan("add", rows, H, 4, "avx512", 2)["stream"]
    assert not plan("add", rows - 1, H, 4, "avx512", 2)["stream"]


def test_a_256_mib_l3_moves_the_streaming_point():
    N, H = 16384, 1024    # 64 MiB of float32 out
    assert plan("forward", N, H, 4, "avx512", 2)["stream"]
    assert not plan("forward", N, H, 4, "avx512", 2, BIG)["stream"]
    assert plan("forward", 8 * N, H, 4, "avx512", 2, BIG)["stream"]
    N = 8192              # 32 MiB of dx
    assert plan("backward", N, H, 4, "avx512", 2)["stream"]
    assert not plan("backward", N, H, 4, "avx512", 2, BIG)["stream"]
    assert plan("backward", 2 * N, H, 4, "avx512", 2, BIG)["stream"]


def test_an_8_mib_laptop_streams_sooner():
    N, H = 1024, 1024     # 4 MiB out
    assert not plan("forward", N, H, 4, "avx512", 2)["stream"]
    assert plan("forward", N, H, 4, "avx512", 2, LAPTOP)["stream"]
    assert plan("forward", 2 * N, H, 4, "avx2", 2, LAPTOP)["stream"]
    assert not plan("forward", 2 * N - 1, H, 4, "avx2", 2, LAPTOP)["stream"]


def test_a_guest_counts_on_a_capped_l3():
    """A virtual machine's reported L3 is its host's, shared with other guests"""
    host = dict(l1=48 * KiB, l2=2 * MiB, l3=480 * MiB)
    for call, expected in REFERENCE:
        assert threshold(*call, caches=host, shared=True) == expected
    assert threshold(*REFERENCE[0][0], caches=host) == REFERENCE[0][1] * 15
    small = dict(l1=32 * KiB, l2=1 * MiB, l3=8 * MiB)     # below the cap: as reported
    assert threshold(*REFERENCE[0][0], caches=small, shared=True) == 4 * MiB


def test_rows_longer_than_the_l1_never_stream():
    for caches in (REF, BIG):
        H = caches["l1"] // 4
        assert plan("forward", 1 << 16, H, 4, "avx2", 2, caches)["stream"]
        assert not plan("forward", 1 << 16, H + 1, 4, "avx2", 2, caches)["stream"]
        assert not plan("backward", 1 << 16, H + 1, 4, "avx2", 2, caches)["stream"]


def test_kernel_internal_thresholds():
    p = plan("backward", 4096, 1024, 4, "avx512", 2)
    assert p["bwd_hot_bytes"] == 2 * MiB and p["pf_range_bytes"] == 4 * MiB
    p = plan("backward", 4096, 1024, 4, "avx512", 2, BIG)
    assert p["bwd_hot_bytes"] == 2 * MiB and p["pf_range_bytes"] == 4 * MiB   # constants


def test_threads_and_row_blocks():
    assert plan("forward", 1, 1 << 20, 4, "avx2", 8)["threads"] == 1       # one row
    assert plan("forward", 8, 1535, 4, "avx2", 8)["threads"] == 1          # < 12288 elements
    assert plan("forward", 8, 1536, 4, "avx2", 8)["threads"] == 8
    assert plan("forward", 3, 1 << 14, 4, "avx2", 8)["threads"] == 3       # at most N
    assert plan("forward", 1 << 14, 64, 4, "avx2", 0)["threads"] == 1
    # row blocks depend on N only: not on threads or caches (bitwise results)
    for N, rb in ((1, 16), (256, 16), (257, 17), (4096, 256), (1 << 20, 256)):
        for t, caches in ((1, REF), (8, BIG)):
            assert plan("backward", N, 64, 4, "avx512", t, caches)["row_block"] == rb


def test_policy_rejects_unknown_arguments():
    with pytest.raises(ValueError, match="kind"):
        plan("sideways", 4, 4, 4, "avx2", 1)
    with pytest.raises(ValueError, match="isa"):
        plan("forward", 4, 4, 4, "sse", 1)
    with pytest.raises(ValueError, match="itemsize"):
        plan("forward", 4, 4, 3, "avx2", 1)


@pytest.mark.parametrize("text,value", [
    ("33554432", 32 * MiB), ("48K", 48 * KiB), ("48k", 48 * KiB), ("2048K", 2 * MiB),
    ("32M", 32 * MiB), ("32MiB", 32 * MiB), ("32MB", 32 * MiB), ("1G", 1024 * MiB),
    ("1", 1), (" 32M", 32 * MiB), ("32m ", 32 * MiB), ("4096B", 4096), ("2gib", 2048 * MiB),
])
def test_parse_cache_bytes(text, value):
    assert _lib._parse_cache_bytes(text) == value


@pytest.mark.parametrize("text", [
    "", "0", "0K", "-1", "32X", "3.5M", "1e6", "0x100", "32 M", "M", "32Mi", "inf",
    "nan", "2P", "99999999999G",
])
def test_parse_cache_bytes_rejects(text):
    assert _lib._parse_cache_bytes(text) is None


def test_invalid_overrides_are_listed():
    env = {"FASTLN_L1_BYTES": "48K", "FASTLN_L2_BYTES": "lots", "FASTLN_L3_BYTES": "0",
           "PATH": "/bin"}
    assert _lib._invalid_cache_env(env) == [("FASTLN_L2_BYTES", "lots"),
                                            ("FASTLN_L3_BYTES", "0")]


def test_overrides_from_the_environment():
    code = ("import fastln, json; from fastln import _lib; "
            "print(json.dumps(_lib._cache_sizes()))")
    import json
    r = run_python(code, env={**__import__("os").environ, "FASTLN_L1_BYTES": "40K",
                              "FASTLN_L2_BYTES": "3M", "FASTLN_L3_BYTES": "256M"})
    assert r.returncode == 0, r.stderr
    c = json.loads(r.stdout)
    assert (c["l1"], c["l2"], c["l3"]) == (40 * KiB, 3 * MiB, 256 * MiB)
    assert c["l3_usable"] == 256 * MiB and not c["l3_shared"]   # an override is not capped


def test_invalid_override_warns_and_is_ignored():
    code = ("import warnings; warnings.simplefilter('error', RuntimeWarning)\n"
            "try:\n    import fastln\nexcept RuntimeWarning as w:\n    print('W', w)\n")
    r = run_python(code, env={**__import__("os").environ, "FASTLN_L3_BYTES": "huge"})
    assert r.returncode == 0, r.stderr
    assert "W FASTLN_L3_BYTES='huge' is not a size" in r.stdout
    code = "import fastln; print(fastln._lib._cache_sizes()['l3'])"
    base = run_python(code, env={k: v for k, v in __import__("os").environ.items()
                                 if not k.startswith("FASTLN_L")})
    r = run_python(code, env={**__import__("os").environ, "FASTLN_L3_BYTES": "huge"})
    assert r.returncode == 0 and r.stdout == base.stdout


def test_fallback_when_nothing_can_be_read(tmp_path):
    d = _lib._detect_caches(sysfs_root=tmp_path)
    assert (d["l1"], d["l2"], d["l3"]) == (32 * KiB, 1 * MiB, 32 * MiB)
    assert d["fallback"] == [1, 2, 3]
    d = _lib._detect_caches()
    assert d["fallback"] == [1, 2, 3] and d["l3"] == 32 * MiB


def write_index(root, i, level, kind, size):
    d = root / f"index{i}"
    d.mkdir()
    for name, value in (("level", level), ("type", kind), ("size", size)):
        (d / name).write_text(f"{value}\n")


def test_sysfs_detection(tmp_path):
    write_index(tmp_path, 0, 1, "Data", "48K")
    write_index(tmp_path, 1, 1, "Instruction", "64K")
    write_index(tmp_path, 2, 2, "Unified", "2048K")
    write_index(tmp_path, 3, 3, "Unified", "491520K")
    d = _lib._detect_caches(sysfs_root=tmp_path)
    assert (d["l1"], d["l2"], d["l3"]) == (48 * KiB, 2 * MiB, 480 * MiB)
    assert d["fallback"] == []


def test_sysfs_detection_missing_l3(tmp_path):
    write_index(tmp_path, 0, 1, "Instruction", "32K")
    write_index(tmp_path, 1, 1, "Data", "32K")
    write_index(tmp_path, 2, 2, "Unified", "garbage")
    d = _lib._detect_caches(sysfs_root=tmp_path)
    assert (d["l1"], d["l2"], d["l3"]) == (32 * KiB, 1 * MiB, 32 * MiB)
    assert d["fallback"] == [2, 3]


def test_machine_detection_finds_sizes():
    d = _lib._detect_caches(sysfs_root="/sys/devices/system/cpu/cpu0/cache",
                             use_sysconf=True, use_cpuid=True)
    assert 4 * KiB <= d["l1"] <= d["l2"] and d["l3"] >= 1 * MiB
    assert d["l3_usable"] <= d["l3"]


def test_set_cache_sizes_round_trip():
    before = _lib._cache_sizes()
    try:
        _lib._set_cache_sizes(l1=32 * KiB, l2=1 * MiB, l3=32 * MiB)
        assert _lib._cache_sizes() == dict(l1=32 * KiB, l2=1 * MiB, l3=32 * MiB,
                                            l3_shared=False, l3_usable=32 * MiB)
    finally:
        _lib._set_cache_sizes()
    assert _lib._cache_sizes() == before


@pytest.mark.parametrize("shape", [(2048, 1024), (65536, 32)])
def test_streaming_does_not_change_results(shape):
    """Streaming only changes the store instruction: results bitwise equal"""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape, dtype=np.float32)
    dy = rng.standard_normal(shape, dtype=np.float32)
    out = {}
    try:
        for l3 in (64 * KiB, 1 << 50):
            _lib._set_cache_sizes(l3=l3)
            y, mean, rstd = fastln.layer_norm(x, return_stats=True)
            dx, dw, db = fastln.layer_norm_backward(dy, x, mean, rstd)
            y2, s = fastln.add_layer_norm(x, dy)
            h = fastln.layer_norm(x.astype(np.float16))
            out[l3] = [a.tobytes() for a in (y, mean, rstd, dx, dw, db, y2, s, h)]
    finally:
        _lib._set_cache_sizes()
    assert out[64 * KiB] == out[1 << 50]

