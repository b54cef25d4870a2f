"""The sandbox's first process: builds the namespaces and the private root, then runs the checker.

Started by the trainer as ``python -I -S sandbox_launcher.py`` with the program's interpreter
(stdlib only, nothing of the package imported), the request as JSON on stdin: the program, its
tests, the limits, the uid. With ``isolate`` it unshares a network namespace (no interface but a
downed loopback), a mount namespace and a pid namespace (a user namespace first when not root),
and pivots into a new root: a size-limited tmpfs holding read-only binds of the system folders
(/usr, /etc, /lib*, /bin, /sbin), the interpreter's prefixes and ``visible`` folders, a few
devices, and the only writable places, ``/sandbox`` (the working folder), ``/tmp``, ``/var/tmp``
and ``/dev/shm``, all in that tmpfs. Nothing else of the host is there: no home, no run output,
no data, no /proc; ``hide`` paths that fall inside a visible folder get an empty mount over them.
Everything written dies with the namespace. Then it forks the checker (:mod:`.sandbox_checker`)
as the pid namespace's init, with the run's own uid: the program's processes cannot signal it,
and when it ends the kernel kills every process left in the namespace.

Exit 125 with one line on stderr when the sandbox cannot be built.
"""

import ctypes
import json
import os
import signal
import sys

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWPID = 0x00020000, 0x10000000, 0x40000000, 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 0x1, 0x2, 0x4, 0x8, 0x20
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = 0x400, 0x800, 0x1000, 0x4000, 0x40000, 0x200000
# statvfs flag -> the mount flag a remount must repeat (in a user namespace they are locked)
KEPT_FLAGS = ((0x2, MS_NOSUID), (0x4, MS_NODEV), (0x8, MS_NOEXEC), (0x400, MS_NOATIME), (0x800, MS_NODIRATIME))
ST_RELATIME = 0x1000
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "arm64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217, "i686": 217}
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
DEVICES = ("null", "zero", "full", "random", "urandom")
WRITABLE = ("/sandbox", "/tmp", "/var/tmp", "/dev/shm")
HERE = os.path.dirname(os.path.abspath(__file__))


def fail(message):
    sys.stderr.write(f"sandbox: {message}\n")
    sys.stderr.flush()
    os._exit(125)


class Mounter:
    def __init__(self):
        self.libc = ctypes.CDLL(None, use_errno=True)

    def mount(self, source, target, fstype, flags, data=None, required=True):
        def b(text):
            return None if text is None else text.encode()

        if self.libc.mount(b(source), b(target), b(fstype), flags, b(data)) != 0:
            if required:
                fail(f"mount of {target} failed: {os.strerror(ctypes.get_errno())}")
            return False
        return True

    def bind_readonly(self, source, target):
        """A read-only view of ``source`` at ``target``, keeping the flags a user namespace locks."""
        self.mount(source, target, None, MS_BIND)
        flags = os.statvfs(target).f_flag
        kept = sum(mount for stat, mount in KEPT_FLAGS if flags & stat) | (MS_RELATIME if flags & ST_RELATIME else 0)
        self.mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept)


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def visible_paths(request):
    """Absolute folders and files shown read-only: the system's, the interpreter's, ``visible``."""
    paths = []
    for path in [*SYSTEM, *request["prefixes"], *request["visible"]]:
        path = os.path.normpath(path)
        if os.path.lexists(path) and path not in paths and path != "/":
            paths.append(path)
    return paths


def build_root(request, mounter, uid):
    """The new root, on /tmp of this mount namespace (a folder anyone can reach): see the module docstring.
    Every source is opened first: a visible folder may itself be below /tmp."""
    sources = []
    for path in sorted(visible_paths(request), key=lambda p: (p.count("/"), p)):
        real = os.path.realpath(path)
        kind = (
            "link" if os.path.islink(path) else "dir" if os.path.isdir(real) else "file" if os.path.isfile(real) else ""
        )
        if kind:
            sources.append((path, kind, os.open(real, os.O_PATH | os.O_CLOEXEC)))
    devices = [(d, os.open("/dev/" + d, os.O_PATH | os.O_CLOEXEC)) for d in DEVICES if os.path.exists("/dev/" + d)]
    new = "/tmp"  # covered in this mount namespace only
    if not os.path.isdir(new) or os.path.islink(new):
        fail("there is no /tmp folder to build the sandbox's root on")
    mounter.mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, f"size={request['limits']['scratch_mb']}m,mode=755")
    for path in WRITABLE:  # first: a visible folder below /tmp is mounted on top of these
        os.makedirs(new + path, exist_ok=True)
        os.chmod(new + path, 0o1777 if path != "/sandbox" else 0o700)
        mounter.mount(new + path, new + path, None, MS_BIND)  # stays writable when the root turns read-only
    if uid >= 0:
        os.chown(new + "/sandbox", uid, uid)
    shown = []
    for path, kind, fd in sources:
        target = new + path
        if kind == "link":  # /bin -> usr/bin: the same link (inside a shown folder: there already)
            if not any(path.startswith(s + "/") for s in shown):
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.symlink(os.readlink(path), target)
            continue
        if kind == "dir":
            os.makedirs(target, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if not os.path.exists(target):
                open(target, "w").close()
        mounter.bind_readonly(f"/proc/self/fd/{fd}", target)
        shown.append(path)
    os.makedirs(new + "/dev", exist_ok=True)
    for device, fd in devices:
        open(f"{new}/dev/{device}", "w").close()
        mounter.mount(f"/proc/self/fd/{fd}", f"{new}/dev/{device}", None, MS_BIND)
    os.symlink("/proc/self/fd", new + "/dev/fd")
    for path in request["hide"]:  # a run's output folder inside a visible folder: an empty view
        target = new + os.path.normpath(path)
        if os.path.isdir(target):
            mounter.mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "size=4k,mode=000")
        elif os.path.isfile(target):
            mounter.mount(new + "/dev/null", target, None, MS_BIND)
    for _, _, fd in sources:
        os.close(fd)
    for _, fd in devices:
        os.close(fd)
    write_program(new + "/sandbox", request, uid)
    os.makedirs(new + "/.old")
    return new


def pivot(mounter, new):
    number = PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        fail(f"pivot_root's system call number is not known on {os.uname().machine}")
    os.chdir(new)
    if mounter.libc.syscall(number, b".", b".old") != 0:
        fail(f"pivot_root failed: {os.strerror(ctypes.get_errno())}")
    os.chdir("/")
    if mounter.libc.umount2(b"/.old", MNT_DETACH) != 0:
        fail(f"detaching the old root failed: {os.strerror(ctypes.get_errno())}")
    os.rmdir("/.old")
    mounter.mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)  # this mount only


def isolate(request, mounter, uid):
    """Enter new namespaces and the new root (this process); its next child is pid 1 of its own."""
    root = os.geteuid() == 0
    host_uid, host_gid = os.getuid(), os.getgid()
    if mounter.libc.unshare(CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWPID | (0 if root else CLONE_NEWUSER)) != 0:
        fail(f"unshare failed: {os.strerror(ctypes.get_errno())} (no namespaces on this machine)")
    if not root:  # the user's own ids, mapped to themselves: its files stay its own
        write("/proc/self/setgroups", "deny")
        write("/proc/self/uid_map", f"{host_uid} {host_uid} 1")
        write("/proc/self/gid_map", f"{host_gid} {host_gid} 1")
    mounter.libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # after the maps: it makes /proc/self root's
    mounter.mount(None, "/", None, MS_REC | MS_PRIVATE)
    pivot(mounter, build_root(request, mounter, uid))


def write_program(folder, request, uid):
    path = os.path.join(folder, "program.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(request["program"])
    if uid >= 0:
        os.chown(path, uid, uid)


def sources():
    texts = {}
    for name in ("wire", "checker", "harness"):
        with open(os.path.join(HERE, f"sandbox_{name}.py"), encoding="utf-8") as f:
            texts[name] = f.read()
    return texts


def checker(request, texts, workdir, isolated):
    namespace = {"__name__": "sandbox_checker"}
    exec(compile(texts["wire"] + "\n" + texts["checker"], os.path.join(HERE, "sandbox_checker.py"), "exec"), namespace)
    return namespace["Checker"](request, workdir, texts["wire"] + "\n" + texts["harness"], isolated)


def main():
    os.umask(0o022)  # the root's folders are built here: a run's private 077 would hide /dev from the program
    request = json.loads(sys.stdin.buffer.read())
    texts = sources()  # before the host's files disappear
    mounter = Mounter()
    uid = request["uid"]
    if not request["isolate"]:
        write_program(os.getcwd(), request, uid)
        run_checker(checker(request, texts, os.getcwd(), False), mounter, uid)
        return 0
    isolate(request, mounter, uid)
    run = checker(request, texts, "/sandbox", True)
    pid = os.fork()
    if pid == 0:  # pid 1 of the new namespace: the program's processes cannot signal it; dies with this one
        run_checker(run, mounter, uid)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 125


def run_checker(run, mounter, uid):
    """The checker, as the run's own uid (root's rights end here), not dumpable, dying with its parent."""
    if uid >= 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    mounter.libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # no ptrace, no /proc/<pid>/mem (set again: setuid resets it)
    mounter.libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    try:
        run.run()
    except SystemExit as err:  # the checker could not start the interpreter
        fail(str(err.code)[len("sandbox: ") :] if isinstance(err.code, str) else "the checker stopped")


if __name__ == "__main__":
    sys.exit(main())
