"""The default thread count from the cgroup CPU quota (fastln/_cgroup.py), on
fake cgroup trees under tmp_path (the machine's own cgroups are only read)."""
import os

import pytest

import fastln
from fastln import _cgroup, _threads

from _util import require, run_python

V2_MOUNT = "30 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw\n"
V1_MOUNT = ("35 25 0:30 {root} /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:10 - cgroup "
            "cgroup rw,cpu,cpuacct\n")
V1_OTHER = ("36 25 0:31 / /sys/fs/cgroup/memory rw,nosuid shared:11 - cgroup cgroup "
            "rw,memory\n")


def write(root, path, text):
    p = root / path.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def v2_tree(root, path, limits):
    """cgroup v2 at /sys/fs/cgroup, the process in path; limits: {dir: cpu.max}"""
    write(root, "/proc/self/mountinfo", V2_MOUNT)
    write(root, "/proc/self/cgroup", f"0::{path}\n")
    write(root, "/sys/fs/cgroup/cgroup.controllers", "cpu memory\n")
    (root / "sys/fs/cgroup" / path.strip("/")).mkdir(parents=True, exist_ok=True)
    for d, text in limits.items():
        write(root, f"/sys/fs/cgroup/{d.strip('/')}/cpu.max".replace("//", "/"), text)


def v1_tree(root, path, quota, period="100000", mount_root="/"):
    write(root, "/proc/self/mountinfo", V1_MOUNT.format(root=mount_root) + V1_OTHER)
    write(root, "/proc/self/cgroup",
          f"12:memory:{path}\n4:cpu,cpuacct:{path}\n1:name=systemd:{path}\n")
    rel = path[len(mount_root.rstrip("/")):] if mount_root != "/" else path
    base = f"/sys/fs/cgroup/cpu,cpuacct/{rel.strip('/')}"
    write(root, f"{base}/cpu.cfs_quota_us", f"{quota}\n")
    write(root, f"{base}/cpu.cfs_period_us", f"{period}\n")


def test_v2_quota(tmp_path):
    v2_tree(tmp_path, "/kubepods/pod1/c1", {"/kubepods/pod1/c1": "200000 100000\n"})
    assert _cgroup.cpu_quota(str(tmp_path)) == 2.0
    assert _cgroup.default_threads(str(tmp_path), cpus=16) == 2
    assert _cgroup.default_threads(str(tmp_path), cpus=1) == 1


def test_v2_no_limit(tmp_path):
    v2_tree(tmp_path, "/user.slice", {"/user.slice": "max 100000\n"})
    assert _cgroup.cpu_quota(str(tmp_path)) is None
    assert _cgroup.default_threads(str(tmp_path), cpus=16) == 16


def test_v2_fractional_quota_rounds_up(tmp_path):
    v2_tree(tmp_path, "/c", {"/c": "150000 100000\n"})
    assert _cgroup.cpu_quota(str(tmp_path)) == 1.5
    assert _cgroup.default_threads(str(tmp_path), cpus=16) == 2
    v2_tree(tmp_path, "/c", {"/c": "10000 100000\n"})     # 0.1 CPU: one thread
    assert _cgroup.default_threads(str(tmp_path), cpus=16) == 1


def test_v2_nested_parent_limit(tmp_path):
    """The smallest limit over the cgroup and its parents applies"""
    v2_tree(tmp_path, "/a/b/c", {"/a": "300000 100000\n", "/a/b": "max 100000\n",
                                 "/a/b/c": "800000 100000\n"})
    assert _cgroup.cpu_quota(str(tmp_path)) == 3.0
    assert _cgroup.default_threads(str(tmp_path), cpus=64) == 3


def test_v2_default_period(tmp_path):
    v2_tree(tmp_path, "/c", {"/c": "400000\n"})
    assert _cgroup.cpu_quota(str(tmp_path)) == 4.0


def test_v2_namespaced_path_reads_the_mount_top(tmp_path):
    """In a cgroup namespace the process may see a path the mount lacks: the
    mount's top (the container's own cgroup) is read"""
    v2_tree(tmp_path, "/", {"/": "250000 100000\n"})
    write(tmp_path, "/proc/self/cgroup", "0::/../../elsewhere\n")
    assert _cgroup.cpu_quota(str(tmp_path)) == 2.5


def test_v1_quota(tmp_path):
    v1_tree(tmp_path, "/docker/abc", 300000)
    assert _cgroup.cpu_quota(str(tmp_path)) == 3.0
    assert _cgroup.default_threads(str(tmp_path), cpus=8) == 3


def test_v1_no_limit(tmp_path):
    v1_tree(tmp_path, "/docker/abc", -1)
    assert _cgroup.cpu_quota(str(tmp_path)) is None
    assert _cgroup.default_threads(str(tmp_path), cpus=8) == 8


def test_v1_fractional_and_period(tmp_path):
    v1_tree(tmp_path, "/docker/abc", 75000, period="50000")
    assert _cgroup.cpu_quota(str(tmp_path)) == 1.5
    assert _cgroup.default_threads(str(tmp_path), cpus=8) == 2


def test_v1_mount_root_inside_the_hierarchy(tmp_path):
    """A container's v1 mount shows its own cgroup as the mount's top"""
    v1_tree(tmp_path, "/docker/abc", 200000, mount_root="/docker/abc")
    assert _cgroup.cpu_quota(str(tmp_path)) == 2.0


def test_v1_nested_parent_limit(tmp_path):
    v1_tree(tmp_path, "/a/b", -1)
    write(tmp_path, "/sys/fs/cgroup/cpu,cpuacct/a/cpu.cfs_quota_us", "100000\n")
    write(tmp_path, "/sys/fs/cgroup/cpu,cpuacct/a/cpu.cfs_period_us", "100000\n")
    assert _cgroup.cpu_quota(str(tmp_path)) == 1.0


def test_without_mountinfo_the_usual_places(tmp_path):
    v2_tree(tmp_path, "/c", {"/c": "200000 100000\n"})
    os.remove(tmp_path / "proc/self/mountinfo")
    assert _cgroup.cpu_quota(str(tmp_path)) == 2.0


@pytest.mark.parametrize("text", ["", "garbage\n", "abc 100000\n", "100000 0\n",
                                  "-5 100000\n"])
def test_unreadable_values_are_no_limit(tmp_path, text):
    v2_tree(tmp_path, "/c", {"/c": text})
    assert _cgroup.cpu_quota(str(tmp_path)) is None


def test_missing_files(tmp_path):
    assert _cgroup.cpu_quota(str(tmp_path)) is None             # nothing at all
    assert _cgroup.default_threads(str(tmp_path), cpus=5) == 5
    write(tmp_path, "/proc/self/cgroup", "0::/c\n")              # no mount, no files
    assert _cgroup.cpu_quota(str(tmp_path)) is None
    v1_tree(tmp_path, "/d", 200000)
    os.remove(tmp_path / "sys/fs/cgroup/cpu,cpuacct/d/cpu.cfs_period_us")
    assert _cgroup.cpu_quota(str(tmp_path)) is None


def test_omp_num_threads_wins(tmp_path):
    v2_tree(tmp_path, "/c", {"/c": "100000 100000\n"})
    assert _threads.default_threads({}, str(tmp_path), cpus=4) == 1
    assert _threads.default_threads({"OMP_NUM_THREADS": "3"}, str(tmp_path), cpus=4) == 0


def test_machine_default_is_within_the_affinity_mask():
    assert 1 <= _cgroup.default_threads() <= _cgroup.affinity_cpus()


@pytest.mark.skipif(not fastln.has_openmp(), reason="needs OpenMP")
def test_default_caps_the_openmp_count_and_the_overrides_win():
    """The quota default applies without a count set; set_num_threads,
    OMP_NUM_THREADS and threadpoolctl win over it"""
    require("threadpoolctl")
    code = """
import fastln
from fastln import _lib
_lib._set_default_threads(1)
a = fastln.get_num_threads()
fastln.set_num_threads(3)
b = fastln.get_num_threads()
fastln.set_num_threads(None)
c = fastln.get_num_threads()
_lib._set_default_threads(0)
d = fastln.get_num_threads()
from threadpoolctl import threadpool_limits
_lib._set_default_threads(1)
with threadpool_limits(2, "openmp"):
    e = fastln.get_num_threads()
print(a, b, c, d, e)
"""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["OMP_NUM_THREADS"] = "4"      # OpenMP's count 4, whatever the machine
    r = run_python(code, env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "3", "1", "4", "2"]
    # with OMP_NUM_THREADS set, fastln's import leaves OpenMP's count alone
    r = run_python("import fastln; print(fastln.get_num_threads())", env)
    assert r.returncode == 0 and r.stdout.split() == ["4"], r.stderr
