"""The CPU quota of the process's control groups (Linux).

A container's CPU limit is a quota of CPU time per period (cgroup v2's
``cpu.max``, v1's ``cpu.cfs_quota_us`` and ``cpu.cfs_period_us``), while
the CPUs it sees, and OpenMP's default thread count, are all of the host's.
:func:`default_threads` gives the thread count that fits the limit, as the
Go runtime and the JVM do: the smaller of the affinity mask's CPU count and
the quota rounded up.

Every function takes the filesystem root as a parameter (``"/"`` for the
machine's own), so that tests can read fake trees.
"""
from __future__ import annotations

import math
import os
import re
from typing import NamedTuple, Optional

Quota = Optional[float]


class Mount(NamedTuple):
    """A cgroup hierarchy's mount: the cgroup path it shows (root) and where."""
    root: str
    point: str


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _under(root: str, path: str) -> str:
    """path (absolute in the process's view) inside the filesystem root."""
    return os.path.join(root, path.lstrip("/"))


def _unescape(field: str) -> str:
    """A mountinfo field with its octal escapes (\\040 for a space) decoded."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mounts(root: str = "/") -> tuple[Optional[Mount], Optional[Mount]]:
    """The cgroup v2 mount and the v1 mount of the cpu controller, from
    /proc/self/mountinfo; where that file is missing, the usual places under
    /sys/fs/cgroup that exist. None for a hierarchy not found."""
    v2 = v1 = None
    text = _read(_under(root, "/proc/self/mountinfo"))
    if text is None:
        base = _under(root, "/sys/fs/cgroup")
        if os.path.exists(os.path.join(base, "cgroup.controllers")):
            v2 = Mount("/", base)
        for name in ("cpu,cpuacct", "cpu", "cpuacct,cpu"):
            if os.path.isdir(os.path.join(base, name)):
                v1 = Mount("/", os.path.join(base, name))
                break
        return v2, v1
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        mount = Mount(_unescape(fields[3]), _under(root, _unescape(fields[4])))
        if tail[0] == "cgroup2" and v2 is None:
            v2 = mount
        elif tail[0] == "cgroup" and "cpu" in tail[2].split(",") and v1 is None:
            v1 = mount
    return v2, v1


def cgroup_paths(root: str = "/") -> tuple[Optional[str], Optional[str]]:
    """The process's cgroup v2 path and its v1 cpu controller's path, from
    /proc/self/cgroup (None where absent)."""
    v2 = v1 = None
    for line in (_read(_under(root, "/proc/self/cgroup")) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        elif "cpu" in parts[1].split(","):
            v1 = parts[2]
    return v2, v1


def _dirs(mount: Mount, path: str) -> list[str]:
    """The directories of cgroup path and of its parents, up to the mount's
    top, deepest first. A path outside the mount's root (a cgroup
    namespace's view) or missing from it starts at the mount's top."""
    rel = path
    if mount.root != "/" and (path + "/").startswith(mount.root.rstrip("/") + "/"):
        rel = path[len(mount.root.rstrip("/")):]
    parts = [p for p in rel.split("/") if p]
    if not os.path.isdir(os.path.join(mount.point, *parts)):
        parts = []
    return [os.path.join(mount.point, *parts[:k]) for k in range(len(parts), -1, -1)]


def _ratio(quota: str, period: str) -> Quota:
    """quota / period in CPUs, or None for no limit or unparsable values."""
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def _v2_quota(directory: str) -> Quota:
    text = _read(os.path.join(directory, "cpu.max"))
    if not text:
        return None
    fields = text.split()
    if fields[0] == "max":
        return None
    return _ratio(fields[0], fields[1] if len(fields) > 1 else "100000")


def _v1_quota(directory: str) -> Quota:
    quota = _read(os.path.join(directory, "cpu.cfs_quota_us"))
    period = _read(os.path.join(directory, "cpu.cfs_period_us"))
    return None if quota is None or period is None else _ratio(quota, period)


def cpu_quota(root: str = "/") -> Quota:
    """The CPUs the process's cgroups allow: the smallest quota / period over
    its cgroup and that cgroup's parents (v2, and v1's cpu controller), or
    None where none sets a limit (or nothing can be read)."""
    found: list[Quota] = []
    mount_v2, mount_v1 = mounts(root)
    path_v2, path_v1 = cgroup_paths(root)
    if mount_v2 is not None and path_v2 is not None:
        found += [_v2_quota(d) for d in _dirs(mount_v2, path_v2)]
    if mount_v1 is not None and path_v1 is not None:
        found += [_v1_quota(d) for d in _dirs(mount_v1, path_v1)]
    limits = [q for q in found if q is not None]
    return min(limits) if limits else None


def affinity_cpus() -> int:
    """The CPUs this process may run on (its affinity mask), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def default_threads(root: str = "/", cpus: Optional[int] = None) -> int:
    """min(cpus, the quota rounded up): the thread count that fits the CPU
    limit (1.5 CPUs: 2). cpus defaults to the affinity mask's CPU count."""
    if cpus is None:
        cpus = affinity_cpus()
    quota = cpu_quota(root)
    if quota is None:
        return cpus
    return max(1, min(cpus, math.ceil(quota)))
