"""A file system that loses what was never synced: the lab's power cut.

A SIGKILL is not a power cut: the kernel's page cache outlives the process, so
every write reaches the disk whether or not it was synced. This module is a
FUSE file system (``mfusepy``, ctypes over Debian's ``libfuse3``) mounted over
a backing directory, whose daemon process plays the machine's memory:

- **Data.** Reads see every write at once. A write reaches the backing file
  only when that file is synced (``fsync`` or ``fdatasync``). ``close`` (FUSE's
  ``flush`` and ``release``) syncs nothing, as on a real disk.
- **Directory entries** (create, rename, unlink of files) follow one of two
  rules, chosen at mount: ``lenient``, durable at once; ``strict``, durable only
  once their directory is synced (``fsync`` of the directory: ``fsyncdir``), as
  POSIX promises and no more. Directories themselves (mkdir, rmdir) are
  durable at once under both rules; the stores here never make or remove one
  mid-run.
- **A cut**: unmounting ends the daemon, and with it everything it held that
  was never synced. On its way out the daemon applies the loss to the backing
  directory (under ``strict``, every directory with unsynced entries goes back
  to its last synced listing) and removes SQLite's ``-shm`` files: they are
  mmap'd scratch that SQLite rebuilds from the WAL, not data. A new daemon
  then mounts over what is left, so no kernel cache of the old mount can hide
  a loss.

The mount has no ``writeback_cache`` and no ``direct_io``: without the first,
every ``write`` reaches the daemon when it is made (the daemon sees the order
of writes and syncs); without the second, SQLite can still ``mmap`` its
``-shm`` file. Locks are the kernel's (no ``lock`` operation is given), which
holds for processes of one machine, the only kind that shares a mount here.

Use it from Python (the tests, ``lab.powercut_matrix``)::

    with PowerCut(backing, mountpoint, dirs="strict") as disk:   # mounted
        ...                                   # set up files under disk.path
        disk.sync_tree()                      # what the test set up is durable
        ...                                   # start processes on disk.path
        report = disk.cut(worker, server)     # SIGKILL, reap, unmount, drop, mount
        ...                                   # restart them on what survived

or by hand (root, ``/dev/fuse``, ``fusermount3``)::

    python -m lab.powercut BACKING MOUNTPOINT --dirs strict    # until unmounted
    fusermount3 -u MOUNTPOINT                                   # the cut

Not modelled: torn writes inside a page, reordering of synced writes, a
backing disk that lies. The backing directory is the disk; it is never
fsynced itself, because the machine running the tests does not lose power.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

DIR_RULES = ("lenient", "strict")
PAGE = 4096
HIDDEN = ".powercut"  # in the backing directory: entries unlinked but still durable, until their directory is synced
_CUT_LINE = re.compile(r"powercut: cut: (?P<body>.*)")


# ---------------------------------------------------------------- the file system (runs in the daemon)


class _Volatile:
    """One backing file and what was written to it since its last sync.

    ``pages`` holds whole pages as the writer last saw them; ``size`` the file's
    size as the writers see it (None: the backing file's); ``floor`` the lowest
    size a truncate gave it since the last sync (backing bytes from there on
    read as zeros, and the sync truncates there first).
    """

    __slots__ = ("fd", "floor", "handles", "ino", "pages", "size")

    def __init__(self, fd: int, ino: int) -> None:
        self.fd, self.ino = fd, ino
        self.pages: dict[int, bytearray] = {}
        self.size: int | None = None
        self.floor: int | None = None
        self.handles = 0

    def visible_size(self) -> int:
        return self.size if self.size is not None else os.fstat(self.fd).st_size

    def dirty(self) -> int:
        """Bytes a cut would drop (0 when synced)."""
        if not self.pages and self.size is None:
            return 0
        return max(1, len(self.pages) * PAGE)

    def read(self, offset: int, length: int) -> bytes:
        end = min(offset + length, self.visible_size())
        if offset >= end:
            return b""
        out = bytearray(end - offset)
        base_end = end if self.floor is None else min(end, self.floor)
        if base_end > offset:
            base = os.pread(self.fd, base_end - offset, offset)
            out[: len(base)] = base
        for index in range(offset // PAGE, (end - 1) // PAGE + 1):
            page = self.pages.get(index)
            if page is None:
                continue
            lo, hi = max(offset, index * PAGE), min(end, (index + 1) * PAGE)
            out[lo - offset: hi - offset] = page[lo - index * PAGE: hi - index * PAGE]
        return bytes(out)

    def _page(self, index: int) -> bytearray:
        page = self.pages.get(index)
        if page is None:
            page = bytearray(PAGE)
            seen = self.read(index * PAGE, PAGE)
            page[: len(seen)] = seen
            self.pages[index] = page
        return page

    def write(self, data: bytes, offset: int) -> int:
        size = self.visible_size()
        done = 0
        while done < len(data):
            at = offset + done
            index, inside = divmod(at, PAGE)
            chunk = data[done: done + PAGE - inside]
            self._page(index)[inside: inside + len(chunk)] = chunk
            done += len(chunk)
        self.size = max(size, offset + len(data))
        return len(data)

    def truncate(self, length: int) -> None:
        size = self.visible_size()
        if length < size:
            index, inside = divmod(length, PAGE)
            if inside:
                self._page(index)[inside:] = bytes(PAGE - inside)
            for extra in [i for i in self.pages if i > index or (i == index and not inside)]:
                del self.pages[extra]
            self.floor = length if self.floor is None else min(self.floor, length)
        self.size = length

    def sync(self) -> None:
        """What a real disk does on fsync: the file's data reaches the platter."""
        if self.size is None and not self.pages:
            return
        size = self.visible_size()
        if self.floor is not None:
            os.ftruncate(self.fd, self.floor)
        for index, page in sorted(self.pages.items()):
            start = index * PAGE
            if start < size:
                os.pwrite(self.fd, bytes(page[: min(PAGE, size - start)]), start)
        os.ftruncate(self.fd, size)
        self.pages.clear()
        self.size = self.floor = None


class PowerCutFS:
    """The FUSE operations (mfusepy calls them, from several threads: one lock)."""

    use_ns = True  # mfusepy: times in nanoseconds

    def __init__(self, backing: str, dirs: str) -> None:
        if dirs not in DIR_RULES:
            raise ValueError(f"dirs must be one of {DIR_RULES}, got {dirs!r}")
        self.root = os.path.realpath(backing)
        self.dirs = dirs
        self.hidden = os.path.join(self.root, HIDDEN)
        self.mutex = threading.RLock()
        self.files: dict[int, _Volatile] = {}  # by backing inode: data follows the file, not its name
        self.handles: dict[int, _Volatile] = {}
        self.dir_handles: dict[int, str] = {}
        self.next_handle = 1
        # strict: directory (relative path) -> {name: inode} as last synced, for directories changed since
        self.listings: dict[str, dict[str, int]] = {}
        self.announce = ""
        self.counts = {"write": 0, "fsync": 0, "fsyncdir": 0, "create": 0, "rename": 0, "unlink": 0}
        os.makedirs(self.hidden, exist_ok=True)

    # -- helpers

    def _real(self, path: str) -> str:
        if path == f"/{HIDDEN}" or path.startswith(f"/{HIDDEN}/"):
            raise OSError(errno.ENOENT, "hidden")
        return self.root + path

    def _volatile(self, real: str) -> _Volatile:
        ino = os.lstat(real).st_ino
        found = self.files.get(ino)
        if found is None:
            found = self.files[ino] = _Volatile(os.open(real, os.O_RDWR), ino)
        return found

    def _entries(self, real_dir: str) -> dict[str, int]:
        found = {}
        with os.scandir(real_dir) as listing:
            for entry in listing:
                if entry.name != HIDDEN and entry.is_file(follow_symlinks=False):
                    found[entry.name] = entry.inode()
        return found

    def _changing(self, *paths: str) -> None:
        """Under ``strict``, remember the synced listing of each path's directory before it changes."""
        if self.dirs != "strict":
            return
        for path in paths:
            parent = os.path.dirname(path)
            if parent not in self.listings:
                self.listings[parent] = self._entries(self.root + parent)

    def _kept(self, ino: int) -> bool:
        return any(ino in listing.values() for listing in self.listings.values())

    def _remove(self, real: str) -> None:
        """Unlink a backing file, unless a synced listing still names it: then it waits in HIDDEN."""
        ino = os.lstat(real).st_ino
        if self._kept(ino):
            os.rename(real, os.path.join(self.hidden, str(ino)))
        else:
            os.unlink(real)
        found = self.files.get(ino)
        if found is not None and found.handles == 0:
            # Unreachable by name now; an open handle keeps it until release.
            os.close(found.fd)
            del self.files[ino]

    def init_with_config(self, conn: Any, config: Any) -> None:
        # A file unlinked while open goes at once (no ".fuse_hidden" rename the stores never made),
        # and operations on it then come with no path: they use the handle.
        if config is not None:
            config.hard_remove = 1
            config.nullpath_ok = 1
        if self.announce:
            print(self.announce, flush=True)

    # -- metadata

    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, Any]:
        with self.mutex:
            if path is None:
                if fh is None or fh not in self.handles:
                    raise OSError(errno.EBADF, "getattr with neither a path nor a file handle")
                st = os.fstat(self.handles[fh].fd)
            else:
                st = os.lstat(self._real(path))
            attrs = {key: getattr(st, key) for key in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size",
                                                        "st_atime_ns", "st_mtime_ns", "st_ctime_ns", "st_ino")}
            for key in ("st_atime", "st_mtime", "st_ctime"):
                attrs[key] = attrs.pop(f"{key}_ns")
            found = self.files.get(st.st_ino)
            if found is not None and found.size is not None:
                attrs["st_size"] = found.size
            return attrs

    def readdir(self, path: str | None, fh: int) -> list[str]:
        with self.mutex:
            path = self.dir_handles[fh]
            names = os.listdir(self._real(path))
            return [".", "..", *(n for n in names if not (path == "/" and n == HIDDEN))]

    def statfs(self, path: str) -> dict[str, int]:
        st = os.statvfs(self.root)
        return {key: getattr(st, key) for key in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail",
                                                  "f_files", "f_ffree", "f_favail", "f_flag", "f_namemax")}

    def chmod(self, path: str, mode: int) -> None:
        os.chmod(self._real(path), mode)

    def chown(self, path: str, uid: int, gid: int) -> None:
        os.chown(self._real(path), uid, gid)

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> None:
        if times is None:
            os.utime(self._real(path))
        else:
            os.utime(self._real(path), ns=times)

    # -- directories (durable at once under both rules)

    def mkdir(self, path: str, mode: int) -> None:
        os.mkdir(self._real(path), mode)

    def rmdir(self, path: str) -> None:
        with self.mutex:
            self.listings.pop(path, None)
            os.rmdir(self._real(path))

    # libfuse gives directory operations after opendir no path (nullpath_ok): the handle names it.
    def opendir(self, path: str) -> int:
        with self.mutex:
            if not os.path.isdir(self._real(path)):
                raise OSError(errno.ENOTDIR, path)
            handle = self.next_handle
            self.next_handle += 1
            self.dir_handles[handle] = path
            return handle

    def releasedir(self, path: str | None, fh: int) -> None:
        with self.mutex:
            self.dir_handles.pop(fh, None)

    def fsyncdir(self, path: str | None, datasync: int, fh: int) -> None:
        with self.mutex:
            self.counts["fsyncdir"] += 1
            if self.listings.pop(self.dir_handles[fh], None) is None:
                return
            for name in os.listdir(self.hidden):
                if not self._kept(int(name)):
                    os.unlink(os.path.join(self.hidden, name))

    # -- entries

    def create(self, path: str, mode: int, flags: int = 0) -> int:
        with self.mutex:
            real = self._real(path)
            self._changing(path)
            self.counts["create"] += 1
            os.close(os.open(real, os.O_CREAT | os.O_RDWR | (flags & os.O_EXCL), mode))
            return self._open(real, flags)

    def unlink(self, path: str) -> None:
        with self.mutex:
            real = self._real(path)
            self._changing(path)
            self.counts["unlink"] += 1
            self._remove(real)

    def rename(self, old: str, new: str) -> None:
        with self.mutex:
            real_old, real_new = self._real(old), self._real(new)
            self._changing(old, new)
            self.counts["rename"] += 1
            if os.path.isfile(real_new):
                self._remove(real_new)
            os.rename(real_old, real_new)

    # -- data

    def _open(self, real: str, flags: int) -> int:
        found = self._volatile(real)
        if flags & os.O_TRUNC:
            found.truncate(0)
        found.handles += 1
        handle = self.next_handle
        self.next_handle += 1
        self.handles[handle] = found
        return handle

    def open(self, path: str, flags: int) -> int:
        with self.mutex:
            return self._open(self._real(path), flags)

    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        with self.mutex:
            return self.handles[fh].read(offset, size)

    def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
        with self.mutex:
            self.counts["write"] += 1
            return self.handles[fh].write(data, offset)

    def truncate(self, path: str | None, length: int, fh: int | None = None) -> None:
        with self.mutex:
            if fh is not None and fh in self.handles:
                self.handles[fh].truncate(length)
            elif path is not None:
                self._volatile(self._real(path)).truncate(length)
            else:
                raise OSError(errno.EBADF, "truncate of an unnamed file without a handle")

    def fsync(self, path: str | None, datasync: int, fh: int) -> None:
        with self.mutex:
            self.counts["fsync"] += 1
            self.handles[fh].sync()

    def flush(self, path: str | None, fh: int) -> None:
        pass  # close(2) is not a sync

    def release(self, path: str | None, fh: int) -> None:
        with self.mutex:
            found = self.handles.pop(fh)
            found.handles -= 1
            if found.handles == 0 and os.fstat(found.fd).st_nlink == 0:  # its name went while it was open
                os.close(found.fd)
                del self.files[found.ino]

    # -- the cut

    def lose_power(self) -> dict[str, int]:
        """Apply to the backing directory what a power cut leaves; returns what was lost."""
        with self.mutex:
            lost = {"files": 0, "bytes": 0, "entries": 0, "shm": 0}
            for found in self.files.values():
                if found.dirty():
                    lost["files"] += 1
                    lost["bytes"] += found.dirty()
                os.close(found.fd)
            self.files.clear()
            self.handles.clear()
            # Entries back to each changed directory's synced listing: first park every entry that
            # differs (by inode, in HIDDEN), then put each synced name back from there.
            wrong: list[tuple[str, dict[str, int]]] = []
            for parent, synced in self.listings.items():
                real_dir = self.root + parent
                current = self._entries(real_dir)
                lost["entries"] += sum(synced.get(n) != current.get(n) for n in {*synced, *current})
                for name, ino in current.items():
                    if synced.get(name) != ino:
                        os.rename(os.path.join(real_dir, name), os.path.join(self.hidden, str(ino)))
                wrong.append((real_dir, synced))
            for real_dir, synced in wrong:
                for name, ino in synced.items():
                    target = os.path.join(real_dir, name)
                    if not os.path.exists(target):
                        os.rename(os.path.join(self.hidden, str(ino)), target)
            self.listings.clear()
            shutil.rmtree(self.hidden, ignore_errors=True)
            for parent, _, names in os.walk(self.root):
                for name in names:
                    if name.endswith("-shm"):
                        os.unlink(os.path.join(parent, name))
                        lost["shm"] += 1
            return lost


def serve(backing: str, mountpoint: str, dirs: str, allow_other: bool = False) -> int:
    """Mount until unmounted (``fusermount3 -u``), then lose power. Prints one line at each end."""
    import mfusepy

    class _Fuse(mfusepy.FUSE):
        # mfusepy drops the file handle of ftruncate(2) on libfuse 3; a store truncating an open,
        # since renamed or unlinked file needs it.
        def truncate_fuse_3(self, path, length, fip):
            fh = fip.contents.fh if fip else None
            return self.operations.truncate(None if path is None else path.decode(), length, fh)

    fs = PowerCutFS(backing, dirs)
    fs.announce = f"powercut: mounted {backing} on {mountpoint} (directories {dirs})"
    # allow_other: other users' processes may use the mount (PostgreSQL runs as its own user, lab.postgres).
    _Fuse(fs, mountpoint, foreground=True, fsname="powercut", subtype="powercut",
          **({"allow_other": True} if allow_other else {}))
    lost = fs.lose_power()
    counts = " ".join(f"{k}={v}" for k, v in fs.counts.items())
    print(f"powercut: cut: lost_files={lost['files']} lost_bytes={lost['bytes']} entries={lost['entries']} "
          f"shm={lost['shm']} seen: {counts}", flush=True)
    return 0


# ---------------------------------------------------------------- the harness (runs in the test)


class Killable(Protocol):
    """A process handle whose ``kill()`` sends SIGKILL and returns once the process is reaped
    (``lab.processes.Proc``, ``DevServer``, ``ProviderProcess``)."""

    def kill(self) -> None: ...


@dataclass(frozen=True)
class CutReport:
    """What one cut dropped: files with unsynced data (and about how many bytes, in pages),
    directory entries put back to their synced state, ``-shm`` files removed; and the
    operations the mount saw before it."""

    lost_files: int
    lost_bytes: int
    entries: int
    shm: int
    seen: dict[str, int]


def unavailable() -> str | None:
    """Why a FUSE mount cannot be made here (None when it can), with what to do about it."""
    if not os.path.exists("/dev/fuse"):
        return "there is no /dev/fuse: FUSE needs it (a container must be given the device)"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is missing: `make test` installs Debian's fuse3; by hand: apt-get install fuse3 libfuse3-3"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:
        return f"mfusepy cannot load libfuse3 ({exc}): pip install -e '.[dev]' and apt-get install libfuse3-3"
    if os.geteuid() != 0 and not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "this user cannot open /dev/fuse: run as root or join the fuse group"
    return None


def holders(mountpoint: Path) -> list[str]:
    """``pid name`` of every process with a file open under ``mountpoint`` (Linux /proc)."""
    prefix = str(mountpoint.resolve())
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target == prefix or target.startswith(prefix + "/"):
                    found.append(f"{proc.name} {(proc / 'comm').read_text().strip()}")
                    break
        except OSError:
            continue
    return found


class PowerCut:
    """A mount of ``PowerCutFS`` over ``backing`` at ``mountpoint``, run by a daemon process.

    ``path`` is where the processes under test keep their files. ``cut``
    loses power; ``close`` (or leaving the ``with`` block) unmounts for good,
    whatever state the mount is in, and never leaves a mount behind.
    """

    def __init__(self, backing: Path, mountpoint: Path, *, dirs: str = "lenient", timeout: float = 30.0,
                 allow_other: bool = False) -> None:
        if dirs not in DIR_RULES:
            raise ValueError(f"dirs must be one of {DIR_RULES}, got {dirs!r}")
        self.backing, self.mountpoint, self.dirs, self.timeout = Path(backing), Path(mountpoint), dirs, timeout
        self.allow_other = allow_other  # other users may use the mount (FUSE's allow_other): lab.postgres's server
        self._daemon: subprocess.Popen[str] | None = None
        self._output: list[str] = []
        self.cuts: list[CutReport] = []

    @property
    def path(self) -> Path:
        return self.mountpoint

    def __enter__(self) -> PowerCut:
        return self.mount()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def mount(self) -> PowerCut:
        why = unavailable()
        if why:
            raise RuntimeError(f"cannot mount the power-cut file system: {why}")
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self._output = []
        self._daemon = subprocess.Popen(
            [sys.executable, "-m", "lab.powercut", str(self.backing), str(self.mountpoint), "--dirs", self.dirs,
             *(["--allow-other"] if self.allow_other else [])],
            cwd=Path(__file__).resolve().parent.parent, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )
        threading.Thread(target=self._read, args=(self._daemon,), daemon=True).start()
        deadline = time.monotonic() + self.timeout
        while not os.path.ismount(self.mountpoint):
            if self._daemon.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"the power-cut mount did not come up on {self.mountpoint}:\n{self.output()}")
            time.sleep(0.02)
        return self

    def _read(self, daemon: subprocess.Popen[str]) -> None:
        assert daemon.stdout is not None
        for line in daemon.stdout:
            self._output.append(line.rstrip("\n"))

    def output(self) -> str:
        return "\n".join(self._output)

    def sync_tree(self) -> None:
        """fsync every file and directory under the mount: what exists now survives the next cut."""
        for parent, _, names in os.walk(self.mountpoint):
            for name in names:
                fd = os.open(os.path.join(parent, name), os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def cut(self, *processes: Killable) -> CutReport:
        """The power cut: SIGKILL ``processes`` and reap them, unmount, drop everything unsynced,
        and mount again over the synced state. Raises if a process not named still holds a file."""
        for process in processes:
            process.kill()
        report = self._unmount(lazy=False)
        self.cuts.append(report)
        self.mount()
        return report

    def _unmount(self, lazy: bool) -> CutReport:
        daemon = self._daemon
        if daemon is None:
            raise RuntimeError("not mounted")
        if os.path.ismount(self.mountpoint):
            done = subprocess.run(["fusermount3", "-u", *(["-z"] if lazy else []), str(self.mountpoint)],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                held = holders(self.mountpoint)
                raise RuntimeError(
                    f"cannot unmount {self.mountpoint} ({done.stderr.strip()}): a process the cut did not name "
                    f"still has files open there: {held or 'none found'}. Name it in cut(), or close it first.")
        try:
            daemon.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait(timeout=10)
            raise RuntimeError(f"the power-cut daemon did not exit after the unmount:\n{self.output()}") from None
        deadline = time.monotonic() + 5
        while not any(_CUT_LINE.search(line) for line in self._output) and time.monotonic() < deadline:
            time.sleep(0.01)  # the reader thread has the last line soon after the exit
        self._daemon = None
        match = next((m for m in map(_CUT_LINE.search, self._output) if m), None)
        if daemon.returncode != 0 or match is None:
            raise RuntimeError(f"the power-cut daemon failed (exit {daemon.returncode}):\n{self.output()}")
        return _parse_report(match["body"])

    def close(self) -> None:
        """Unmount for good (lazily if something still holds it) and end the daemon."""
        daemon = self._daemon
        if os.path.ismount(self.mountpoint) or (daemon is not None and daemon.poll() is None):
            try:
                self._unmount(lazy=True)
            except RuntimeError:
                pass
        if daemon is not None and daemon.poll() is None:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait(timeout=10)
        if os.path.ismount(self.mountpoint):  # the daemon died and left the mount ("not connected")
            subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], capture_output=True)
        self._daemon = None


def mounts_under(path: Path) -> list[str]:
    """Mount points at or under ``path`` (Linux /proc/self/mountinfo; octal escapes decoded)."""
    root = str(Path(path).resolve())
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), line.split()[4])
        if point == root or point.startswith(root + "/"):
            found.append(point)
    return found


def unmount_all_under(path: Path) -> list[str]:
    """Lazily unmount every mount under ``path``: a finalizer's last resort. Returns what it unmounted."""
    found = mounts_under(path)
    for point in sorted(found, reverse=True):
        subprocess.run(["fusermount3", "-u", "-z", point], capture_output=True)
    return found


def _parse_report(body: str) -> CutReport:
    lost, _, seen = body.partition(" seen: ")
    values = dict(pair.split("=") for pair in lost.split())
    return CutReport(int(values["lost_files"]), int(values["lost_bytes"]), int(values["entries"]),
                     int(values["shm"]), {k: int(v) for k, v in (p.split("=") for p in seen.split())})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Mount the power-cut file system (until fusermount3 -u).")
    parser.add_argument("backing", help="the directory that plays the disk")
    parser.add_argument("mountpoint", help="where the processes under test keep their files")
    parser.add_argument("--dirs", choices=DIR_RULES, default="lenient",
                        help="when directory entries become durable: at once, or when their directory is synced")
    parser.add_argument("--allow-other", action="store_true",
                        help="let other users' processes use the mount (FUSE's allow_other; root, or user_allow_other "
                             "in /etc/fuse.conf)")
    args = parser.parse_args(argv)
    why = unavailable()
    if why:
        print(f"powercut: {why}", file=sys.stderr)
        return 2
    return serve(args.backing, args.mountpoint, args.dirs, args.allow_other)


if __name__ == "__main__":
    sys.exit(main())
