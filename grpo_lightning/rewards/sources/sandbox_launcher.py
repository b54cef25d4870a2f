"""Runs inside the sandbox's child process before the untrusted program: applies the limits, then
``exec``s the program. Stdlib only, started with ``python -I`` (nothing of the package is imported).

argv: ``cpu_s memory_mb file_mb processes isolate(0/1) uid -- python program.py``. In order: a
network namespace with only a downed loopback and a mount namespace with fresh tmpfs over /tmp,
/var/tmp and /dev/shm (a user namespace first when not root); then the rlimits; then, when root,
the run's own unprivileged ``uid`` (one per concurrent run), so the process limit counts for this
run alone, root's files are read-only, and every process of the run can be killed by uid.
Exit 125 with a line on stderr when isolation was asked for and fails.

``--reap uid``: become ``uid`` and SIGKILL every process it has (``kill(-1)``): what a run left.
"""

import ctypes
import os
import resource
import sys

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
MS_BIND, MS_REC, MS_PRIVATE, MS_NOSUID, MS_NODEV = 0x1000, 0x4000, 0x40000, 0x2, 0x4
PRIVATE_TMP = ("/tmp", "/var/tmp", "/dev/shm")


def fail(message):
    sys.stderr.write(f"sandbox: {message}\n")
    os._exit(125)


def isolate(libc):
    flags = CLONE_NEWNET | CLONE_NEWNS | (0 if os.geteuid() == 0 else CLONE_NEWUSER)
    if libc.unshare(flags) != 0:
        fail(f"unshare failed (errno {ctypes.get_errno()}): no network namespace")
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return  # the network is gone; the shared /tmp stays (a program may leave files there)
    workdir = os.getcwd()
    keep = os.open(workdir, os.O_PATH)
    for path in PRIVATE_TMP:
        if os.path.isdir(path):
            libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=16m,mode=1777")
    if not os.path.isdir(workdir):  # it was under a private tmpfs: bring it back at its path
        os.makedirs(workdir)
        if libc.mount(f"/proc/self/fd/{keep}".encode(), workdir.encode(), None, MS_BIND, None) != 0:
            fail(f"bind mount of the working directory failed (errno {ctypes.get_errno()})")
    os.chdir(workdir)
    os.close(keep)


def limit(kind, value):
    resource.setrlimit(kind, (value, value))


def main():
    cpu_s, memory_mb, file_mb, processes, isolated, uid = (int(a) for a in sys.argv[1:7])
    program = sys.argv[8:]
    libc = ctypes.CDLL(None, use_errno=True)
    if isolated:
        isolate(libc)
    limit(resource.RLIMIT_CPU, cpu_s)
    limit(resource.RLIMIT_AS, memory_mb * 2**20)
    limit(resource.RLIMIT_FSIZE, file_mb * 2**20)
    limit(resource.RLIMIT_CORE, 0)
    limit(resource.RLIMIT_NOFILE, 64)
    if uid >= 0:  # root ignores RLIMIT_NPROC and may write anywhere: become the run's own uid
        become(uid)
    limit(resource.RLIMIT_NPROC, processes)
    os.execv(program[0], program)


def become(uid):
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def reap(uid):
    become(uid)
    for _ in range(3):  # a fork in flight may survive one sweep
        try:
            os.kill(-1, 9)
        except ProcessLookupError:
            return


if __name__ == "__main__":
    if sys.argv[1] == "--reap":
        reap(int(sys.argv[2]))
    else:
        main()
