"""One bubblewrap sandbox per submission: what it can see, what it may use, and how it is stopped.

Inside a sandbox (`bwrap`, Debian package `bubblewrap`):
- its own user, PID, network, IPC and UTS namespaces (`--unshare-all`): no network, no signal
  reaches the grader or another sandbox, and when its first process ends every process it started
  ends too (`--die-with-parent` ties it to the grader: a killed grader takes its sandboxes along);
- an unprivileged user: the namespace's uid 65534, or, when the grader runs as root, a real
  unprivileged uid per concurrent sandbox (60001, 60002, ...) that Python switches to first;
- read-only: the system's /usr, the Python installation, and a copy of course_utils made for
  this run WITHOUT the solution modules of the submission's lesson and later lessons (earlier
  lessons' kernels, which later exercises reuse, stay importable), also in place of a course installed into
  the Python's site-packages;
- writable: a private /tmp and /submission (where the notebook's copy lies), both size-limited tmpfs
  that vanish with the sandbox, and a smaller /dev/shm; the root and /dev are read-only. Nothing
  the grader later reads is on them;
- limits: address data (RLIMIT_DATA), processes and threads (RLIMIT_NPROC), core files off; in CPU mode
  also the address space (RLIMIT_AS): shared memory (mmap.mmap(-1, n), memfd_create) is no process's data
  and no tmpfs of the sandbox's, so only the address space bounds it. The grader adds the wall time and
  the output size (the output pipe is drained and cut).
- the rlimits bind each process: a notebook that started four processes of 0.7 GiB held 2.8 GiB under a limit
  of 1 GiB. A root grader also puts each sandbox in a cgroup of its own (Cgroup: v2, or v1's memory and pids
  hierarchies) that bounds the memory of all its processes together (data, tmpfs and shared memory pages) and
  their number; elsewhere the grader warns that the memory is bounded per process only (CGROUP_WARNING).
- RLIMIT_NPROC counts the processes and threads of a real uid, machine-wide: sandboxes of a root grader
  each have a uid of their own; a grader that is not root maps every sandbox to its own uid, so that one
  notebook's threads would starve the sandboxes beside it. Such a grader runs one sandbox at a time
  (own_uids).
On a GPU the /dev/nvidia* devices are bound and Triton gets a private cache in /tmp.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # course_utils/
ROOT = PACKAGE.parent
WORKDIR = "/submission"  # the notebook's folder inside a sandbox
COURSE = "/course"  # the course package inside a sandbox (on sys.path first)
SANDBOX_UID = 65534
ROOT_UIDS = 60001  # first real uid a root grader gives its sandboxes
GPU_MEMORY = 16 << 30  # the default data limit on a GPU machine (the CUDA runtime maps a lot)
# The address space a CPU-mode sandbox may map beyond its data limit. A lesson 02 or 03 solution peaked at
# 1.1 GiB of address space with 0.33 GiB of data (2 cores, 4 threads): the rest is torch's and Triton's
# libraries and reservations. Each thread adds its stack and, up to 8 per core, a malloc arena reserved
# whole (8 + 64 MiB), and torch starts one thread per core: AS_PER_CPU for each.
AS_HEADROOM = 2 << 30
AS_PER_CPU = 128 << 20


@dataclass
class Limits:
    memory: int = 3 << 30  # bytes of data (heap, anonymous mappings) per sandbox; more on a GPU (GPU_MEMORY)
    processes: int = 1024  # processes and threads of the sandbox's user
    output: int = 16 << 20  # bytes a notebook may print in all; more ends it
    tmpfs: int = 1 << 30  # bytes of /tmp and of /submission each
    shm: int = 64 << 20  # bytes of /dev/shm (POSIX shared memory and semaphores)
    # bytes of address space (RLIMIT_AS), the backstop for shared memory; None: cpu_address_space(memory)
    # in CPU mode, no limit on a GPU, where the CUDA driver reserves terabytes of address space it never uses
    address_space: int | None = None


def cpu_address_space(memory: int) -> int:
    """The default address space of a CPU-mode sandbox whose data limit is `memory`."""
    return memory + AS_HEADROOM + AS_PER_CPU * (os.cpu_count() or 1)


def own_uids(sandboxed: bool) -> bool:
    """Does each concurrent sandbox run as a real uid of its own (a root grader with bubblewrap)? Otherwise
    they share the grader's, and with it one RLIMIT_NPROC budget: one notebook that starts threads until
    the limit leaves the others unable to start any (their checks die), so one sandbox runs at a time."""
    return sandboxed and os.geteuid() == 0


SHARED_UID_WARNING = """WARNING: grading one notebook at a time (--jobs {jobs} asked): the sandboxes cannot get user ids of their
  own ({why}), and the limit on processes and threads (RLIMIT_NPROC) counts all the processes of one user
  id: a notebook that starts threads until that limit would leave the notebooks graded beside it unable
  to start any. Run the grader as root (each sandbox then switches to a user id of its own) to grade
  several at a time."""


def bwrap() -> str | None:
    return shutil.which("bwrap")


def probe() -> str:
    """"" when sandboxes work here; otherwise why not (bwrap missing, user namespaces refused, the sandbox's
    Python not starting)."""
    exe = bwrap()
    if exe is None:
        return "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
    cmd = [exe, *_namespaces(), "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        return f"bwrap cannot create its namespaces here ({_last_line(done)}); on Ubuntu 24.04 and later: " \
               "sysctl kernel.apparmor_restrict_unprivileged_userns=0"
    return _python_starts()


def _last_line(done: subprocess.CompletedProcess) -> str:
    """The last line a failed probe printed on stderr, or its exit code."""
    return (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]


# What every notebook's first cell loads. Installed by a root whose umask was 077, these files are root's
# alone: the sandbox's Python starts, and every notebook dies at its first import.
PROBE_IMPORTS = ("torch", "triton")
_started: dict[tuple[str, tuple[str, ...]], str] = {}  # the probe's answer per Python and imports (seconds)


def _python_starts() -> str:
    """"" when this Python starts inside a sandbox as the sandbox's user and imports what the notebooks
    need; otherwise why not. A root grader's sandboxes run as uids of their own (60001, ...): a Python
    installation, or a library it loads, that only root may read would leave every notebook dead at its
    first cell (exit code 126 or 127, or an ImportError)."""
    key = (sys.executable, PROBE_IMPORTS)
    if key not in _started:
        _started[key] = _start_python()
    return _started[key]


def _start_python() -> str:
    limits = Limits()
    with tempfile.TemporaryDirectory() as course, open(os.devnull, "rb") as empty:
        cmd = command(Path(course), empty.fileno(), "probe.ipynb", gpu=False, limits=limits)
        cmd = [*cmd[:cmd.index("-m")], "-c", f"import {', '.join(PROBE_IMPORTS)}"]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, pass_fds=(empty.fileno(),),
                                  preexec_fn=lambda: _set_limits(limits))
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"the sandbox's Python could not be started ({exc})"
    if done.returncode != 0:
        user = f"uid {ROOT_UIDS}" if os.geteuid() == 0 else "the sandbox's user"
        return (f"{sys.executable} does not start and import {', '.join(PROBE_IMPORTS)} inside a sandbox as "
                f"{user} ({_last_line(done)}); every folder and library of the Python installation must be "
                "readable by all users")
    return ""


NO_SANDBOX_WARNING = """\
WARNING: grading WITHOUT a sandbox: {why}.
  Each notebook still runs in its own process, in a private temporary folder, and the verdicts are
  still computed in the grader's process from the raw outputs; but a submission can now read and
  write every file this user can (other submissions, the course's solutions, the grader's code),
  signal or outlive the grader, use the network, and allocate without limit. Grade untrusted
  submissions only with bubblewrap working."""


def _namespaces() -> list[str]:
    if os.geteuid() == 0:  # no user namespace: the sandbox switches to an unprivileged uid itself
        return ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    return ["--unshare-all", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]


# --- the course package, without the solutions --------------------------------------------------

def _lesson_of_module(name: str) -> int | None:
    if len(name) > 3 and name[0] == "l" and name[1:3].isdigit():
        return int(name[1:3])
    return None


def stage_package(into: Path, lesson: int) -> Path:
    """A copy of course_utils under `into`/lNN/ keeping only the solution modules of lessons before
    `lesson` (made once per lesson and run; read-only inside every sandbox). Returns the folder to
    put on sys.path."""
    target = into / f"l{lesson:02d}"
    if target.exists():
        return target

    def ignore(folder: str, names: list[str]) -> set[str]:
        skip = {n for n in names if n == "__pycache__" or n.endswith((".pyc", ".egg-info"))}
        if Path(folder).resolve() == (PACKAGE / "lessons").resolve():
            for n in names:
                number = _lesson_of_module(n)
                if number is not None and number >= lesson:
                    skip.add(n)
        return skip

    partial = into / f".l{lesson:02d}.partial"
    shutil.copytree(PACKAGE, partial / "course_utils", ignore=ignore)
    for path in partial.rglob("*"):
        path.chmod(0o555 if path.is_dir() else 0o444)
    partial.chmod(0o555)
    partial.rename(target)
    return target


# --- the command --------------------------------------------------------------------------------

def _python_paths() -> list[str]:
    """Folders the sandbox's Python needs (its installation and site-packages), outside the course."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             str(Path(os.path.realpath(sys.executable)).parent.parent)}
    paths.update(p for p in sys.path if p and os.path.isdir(p))
    # The folder the grader was started from is on sys.path (`python -m`), and may hold the course, the
    # submissions or earlier reports: never mounted, nor any folder that holds the course.
    started_in = os.path.realpath(os.getcwd())
    paths.discard(os.getcwd())
    keep = []
    for p in sorted(paths, key=len):
        real = os.path.realpath(p)
        if real in ("/", "/usr") or real.startswith("/usr/") or not os.path.isdir(real):
            continue
        if real == started_in or os.path.realpath(ROOT).startswith(real + os.sep):
            continue
        inside_course = real == str(ROOT) or real.startswith(str(ROOT) + os.sep)
        if inside_course and not real.startswith(os.path.realpath(sys.prefix)):
            continue  # the course's own folders (solutions, submissions): never; its .venv: yes
        if any(real == k or real.startswith(k + os.sep) for k in keep):
            continue
        keep.append(real)
    return keep


def _etc_files() -> list[str]:
    names = ["ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime", "os-release",
             "nsswitch.conf", "ssl", "ca-certificates", "fonts", "matplotlibrc"]
    return [f"/etc/{n}" for n in names if os.path.exists(f"/etc/{n}")]


def _libcuda_dirs() -> list[str]:
    """The folders holding the CUDA driver's libcuda.so.1, as the grader's Triton finds them. Triton links
    each kernel's launcher against libcuda, found by TRITON_LIBCUDA_PATH or else by `/sbin/ldconfig -p`:
    the sandbox's clean environment drops the variable, and its ldconfig reads only the cache in /etc. The
    grader asks once, outside, and tells each sandbox. [] without a CUDA driver."""
    try:
        from triton.backends.nvidia.driver import libcuda_dirs
        return list(libcuda_dirs())
    except (ImportError, AssertionError, OSError, subprocess.CalledProcessError):
        return []


def command(course: Path, notebook_fd: int, notebook_name: str, *, gpu: bool, limits: Limits,
            slot: int = 0) -> list[str]:
    """The bwrap command line of one sandbox running `python -m course_utils.grading.remote`."""
    exe = bwrap()
    assert exe is not None
    cmd = [exe, *_namespaces(), "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            cmd += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            cmd += ["--ro-bind", top, top]
    cmd += ["--ro-bind", "/usr", "/usr", "--perms", "0755", "--dir", "/etc"]  # not bwrap's 0700: root's only
    for path in _etc_files():
        cmd += ["--ro-bind", path, path]
    # The private /tmp first: a checkout (and its .venv) that lives under /tmp is bound on top of it below.
    cmd += ["--perms", "1777", "--size", str(limits.tmpfs), "--tmpfs", "/tmp"]
    # The CUDA driver's folder, its links followed (the sandbox has its own /lib link, no other), bound
    # unless /usr holds it (the sandbox sees /usr already)
    libcuda = [os.path.realpath(p) for p in _libcuda_dirs()[:1]] if gpu else []
    driver = [p for p in libcuda if not p.startswith("/usr/")]
    made: set[str] = set()
    for path in [*_python_paths(), *driver]:
        for parent in reversed(Path(path).parents[:-1]):  # bwrap would make them 0700: root's only
            if str(parent) not in made:
                made.add(str(parent))
                cmd += ["--perms", "0755", "--dir", str(parent)]
        cmd += ["--ro-bind", path, path]
    # The course installed into the Python's site-packages (`pip install .`, not editable) holds every lesson's
    # solutions, which the bind above shows: the staged package (without them) stands in its place there too
    staged = course / "course_utils"
    for path in _python_paths():
        installed = os.path.join(path, "course_utils")
        if os.path.isdir(installed) and staged.is_dir():
            cmd += ["--ro-bind", str(staged), installed]
    cmd += ["--proc", "/proc", "--dev", "/dev",
            "--perms", "1777", "--size", str(limits.tmpfs), "--tmpfs", WORKDIR,
            "--ro-bind", str(course), COURSE,
            "--perms", "0666", "--file", str(notebook_fd), f"{WORKDIR}/{notebook_name}",
            "--chdir", WORKDIR]
    if gpu:
        for dev in sorted(Path("/dev").glob("nvidia*")):
            cmd += ["--dev-bind", str(dev), str(dev)]
        cmd += ["--ro-bind-try", "/sys", "/sys"]
    # bwrap builds the root and /dev on tmpfs of half the machine's memory, owned by the sandbox's user when
    # it has a user namespace (a grader that is not root): writable past every limit, since tmpfs pages are
    # no process's data. Once built, both are read-only, and /dev/shm is a small tmpfs of its own.
    cmd += ["--perms", "1777", "--size", str(limits.shm), "--tmpfs", "/dev/shm",
            "--remount-ro", "/dev", "--remount-ro", "/"]
    if os.geteuid() == 0:
        # setpriv needs SETUID and SETGID to switch to the sandbox's uid, and SETPCAP to empty the bounding
        # set first: libcap-ng 0.8.4 (Ubuntu 24.04) refuses `--bounding-set=-all` without it (exit 127,
        # "apply bounding set: Operation not permitted"), and 0.8.3 (Debian 12) skipped it unsaid.
        cmd += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "USER": "student", "LANG": "C.UTF-8",
           "PYTHONPATH": COURSE, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
           "MPLBACKEND": "Agg", "TRITON_CACHE_DIR": "/tmp/triton", "XDG_CACHE_HOME": "/tmp/cache",
           "COURSE_MODE": "gpu" if gpu else "interpret"}
    if libcuda:
        env["TRITON_LIBCUDA_PATH"] = libcuda[0]
    for name in ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS"):
        if name in os.environ:
            env[name] = os.environ[name]
    cmd.append("--clearenv")
    for key, value in env.items():
        cmd += ["--setenv", key, value]
    python = [sys.executable, "-s", "-B"]
    if os.geteuid() == 0:
        uid = str(ROOT_UIDS + slot)
        python = ["/usr/bin/setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                  "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", *python]
    return [*cmd, "--", *python, "-m", "course_utils.grading.remote"]


def _set_limits(limits: Limits) -> None:
    """In the child before exec (bwrap and everything under it)."""
    import resource

    resource.setrlimit(resource.RLIMIT_DATA, (limits.memory, limits.memory))
    if limits.address_space:
        resource.setrlimit(resource.RLIMIT_AS, (limits.address_space, limits.address_space))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


CGROUPS = Path("/sys/fs/cgroup")
CGROUP_WARNING = """WARNING: the memory limit binds each process of a sandbox, not the sandbox: no cgroup could be made
  ({why}). A notebook that starts many processes can take all of the machine's memory. Run the grader as
  root on a machine with a writable cgroup hierarchy (v2, or v1's memory and pids) to bound each sandbox."""


class Cgroup:
    """A cgroup of one sandbox's processes: their memory in all (what the rlimits allow one process, plus
    its tmpfs and /dev/shm, whose pages are charged to it) and their number. Made by a root grader; bwrap
    joins it before exec (join), and everything it starts stays in it. OSError where none can be made."""

    def __init__(self, limits: Limits, name: str):
        memory = limits.memory + 2 * limits.tmpfs + limits.shm
        if (CGROUPS / "cgroup.controllers").exists():  # v2: one hierarchy, the controllers enabled for children
            _write(CGROUPS / "cgroup.subtree_control", "+memory +pids")
            settings = {CGROUPS / name: {"memory.max": memory, "memory.swap.max": 0, "pids.max": limits.processes}}
        else:  # v1: a hierarchy per controller, inside the grader's own cgroups (a container's limit still binds)
            settings = {_own_v1("memory") / name: {"memory.limit_in_bytes": memory},
                        _own_v1("pids") / name: {"pids.max": limits.processes}}
        self.folders: list[Path] = []
        try:
            for folder, values in settings.items():
                folder.mkdir()
                self.folders.append(folder)
                for key, value in values.items():
                    if key != "memory.swap.max" or (folder / key).exists():
                        _write(folder / key, str(value))
        except OSError:
            self.remove()
            raise

    def join(self) -> None:
        """In the child before exec: it, and so all it starts, into the cgroup."""
        for folder in self.folders:
            _write(folder / "cgroup.procs", str(os.getpid()))

    def remove(self) -> None:
        """Once its processes are gone (killed: their exit may take a moment)."""
        for folder in self.folders:
            for _ in range(50):
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


def _own_v1(controller: str) -> Path:
    """The grader's own cgroup in v1's hierarchy of `controller` (/proc/self/cgroup: "4:memory:/path")."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return CGROUPS / controller / path.lstrip("/")
    raise FileNotFoundError(f"no {controller} cgroup hierarchy")


def _write(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def make_cgroup(limits: Limits, slot: int) -> tuple[Cgroup | None, str]:
    """(the cgroup of a new sandbox, "") or (None, why there is none)."""
    if os.geteuid() != 0:
        return None, "the grader is not root"
    try:
        return Cgroup(limits, f"course-grade-{os.getpid()}-{slot}"), ""
    except OSError as exc:
        return None, f"{CGROUPS}: {exc.strerror or exc}"


class Sandbox:
    """A running sandbox: the protocol pipes, the output drained in a thread, kill()."""

    def __init__(self, cmd: list[str], limits: Limits, *, pass_fds: tuple[int, ...] = (),
                 env: dict | None = None, cwd: str = "/", cgroup: Cgroup | None = None):
        self.limits, self.cgroup = limits, cgroup

        def prepare() -> None:
            _set_limits(limits)
            if cgroup is not None:
                cgroup.join()

        self.process = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            pass_fds=pass_fds, start_new_session=True, preexec_fn=prepare, env=env, cwd=cwd,
        )
        self.output_bytes = 0
        self.too_much_output = False
        self._tail = bytearray()
        self._drain = threading.Thread(target=self._read_output, daemon=True)
        self._drain.start()

    def _read_output(self) -> None:
        stream = self.process.stderr
        while True:
            chunk = stream.read1(1 << 16) if hasattr(stream, "read1") else stream.read(1 << 16)
            if not chunk:
                return
            self.output_bytes += len(chunk)
            self._tail += chunk
            del self._tail[:-8192]
            if self.output_bytes > self.limits.output and not self.too_much_output:
                self.too_much_output = True
                self.kill()

    def tail(self) -> str:
        return self._tail.decode("utf-8", errors="replace")

    def kill(self) -> None:
        """SIGKILL the sandbox's whole session (bwrap and, through its PID namespace, everything in it)."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.process.kill()
            except ProcessLookupError:
                pass

    def close(self) -> int | None:
        self.kill()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        self._drain.join(timeout=5)
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            try:
                stream.close()
            except OSError:
                pass
        if self.cgroup is not None:
            self.cgroup.remove()
        return self.process.returncode


def unsandboxed(course: Path, workdir: Path, *, gpu: bool) -> tuple[list[str], dict]:
    """The fallback without bwrap: a plain child process (command, environment)."""
    env = dict(os.environ, PYTHONPATH=str(course), PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1",
               MPLBACKEND="Agg", COURSE_MODE="gpu" if gpu else "interpret",
               TRITON_CACHE_DIR=str(workdir / ".triton"))
    env.pop("TRITON_INTERPRET", None)
    return [sys.executable, "-s", "-B", "-m", "course_utils.grading.remote"], env


def temp_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="course-grade-"))
