"""Writing an archive's members into a directory so that nothing lands outside it (issue #39).

Every path component is opened by this code itself, relative to a directory
it opened before (`dir_fd`), with O_NOFOLLOW: a member can never reach through
a link, whatever the chain of links the archive made before it (the `tarfile`
realpath bypass of 2025 walked one past the path-length limit). Files are
created with O_EXCL|O_NOFOLLOW (a member that names an existing one replaces
it: the old one is unlinked first, never written through). Member paths are
cleaned first: `.` and empty components are dropped; an absolute path and a
`..` are refused (GNU tar drops a leading `/`; libarchive's secure mode
refuses it, as this does: a dataset names nothing outside itself). Symbolic
links are kept only when their target is relative and descends (no `..`):
from any directory inside the tree such a link resolves inside it. Hard
links name a member already written.
Devices, fifos and anything else are the caller's to refuse.
"""

from __future__ import annotations

import errno
import os

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeMember(Exception):
    """A member that would be written outside the directory, or could not be written safely (the reason says)."""


def clean(name: str, *, root_ok: bool = False) -> tuple[str, ...]:
    """The path components of member `name`, relative to the tree; UnsafeMember for an absolute path, a `..`, or
    an empty path (`root_ok`: `.` or `./`, the tree itself, is () -- a directory member naming the root)."""
    if "\0" in name:
        raise UnsafeMember(f"member {name!r} has a NUL in its name")
    if name.startswith("/"):
        raise UnsafeMember(f"member {name!r} is an absolute path (only paths inside the dataset's directory are "
                           "kept)")
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if ".." in parts:
        raise UnsafeMember(f"member {name!r} climbs out of the dataset's directory with '..'")
    if not parts and not (root_ok and name.strip("/") in ("", ".")):
        raise UnsafeMember(f"member {name!r} names no path")
    return parts


def link_target_ok(target: str) -> bool:
    """A symbolic link's target that resolves inside the tree from wherever the link is: relative, no `..`."""
    return bool(target) and not target.startswith("/") and "\0" not in target and \
        ".." not in target.split("/")


class SafeTree:
    """A directory this code writes members into, through directory descriptors it opened itself."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        os.makedirs(root, exist_ok=True)
        self.root = os.open(root, _DIR)
        #: The parent directory of the last member: (its components, its descriptor) (members come in order).
        self._last: tuple[tuple[str, ...], int] | None = None

    def close(self) -> None:
        self._forget()
        os.close(self.root)

    def __enter__(self) -> SafeTree:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _forget(self) -> None:
        if self._last is not None:
            os.close(self._last[1])
            self._last = None

    def _dir(self, parts: tuple[str, ...], *, create: bool) -> int:
        """A descriptor of directory `parts` (the tree's own for ()), walked one component at a time, each
        opened with O_NOFOLLOW; `create`: make what is missing. Borrowed: do not close it."""
        if not parts:
            return self.root
        if self._last is not None and self._last[0] == parts:
            return self._last[1]
        fd = os.dup(self.root)
        try:
            for i, name in enumerate(parts):
                try:
                    nxt = os.open(name, _DIR, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise UnsafeMember(f"{'/'.join(parts[:i + 1])} does not exist") from None
                    os.mkdir(name, 0o755, dir_fd=fd)
                    nxt = os.open(name, _DIR, dir_fd=fd)
                except OSError as e:
                    if e.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise UnsafeMember(f"{'/'.join(parts[:i + 1])} is a link or a file, not a directory: "
                                           "no member may go through it") from None
                    raise
                os.close(fd)
                fd = nxt
        except BaseException:
            os.close(fd)
            raise
        self._forget()
        self._last = (parts, fd)
        return fd

    def _vacate(self, dfd: int, name: str) -> None:
        """Make room for a new entry `name` in `dfd`: an older file or link of that name goes (never a directory)."""
        try:
            os.unlink(name, dir_fd=dfd)
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            raise UnsafeMember(f"a member replaces the directory {name!r} with a file or link") from None
        except PermissionError:  # (Linux says EISDIR; others EPERM)
            raise UnsafeMember(f"a member replaces the directory {name!r} with a file or link") from None

    def mkdir(self, parts: tuple[str, ...]) -> None:
        self._dir(parts, create=True)

    def create(self, parts: tuple[str, ...], executable: bool) -> int:
        """A new regular file at `parts`, opened for writing (the caller closes it)."""
        dfd = self._dir(parts[:-1], create=True)
        mode = 0o755 if executable else 0o644
        try:
            return os.open(parts[-1], _NEW, mode, dir_fd=dfd)
        except FileExistsError:
            self._vacate(dfd, parts[-1])
            return os.open(parts[-1], _NEW, mode, dir_fd=dfd)

    def symlink(self, parts: tuple[str, ...], target: str) -> None:
        if not link_target_ok(target):
            raise UnsafeMember(f"member {'/'.join(parts)!r} is a link to {target!r}, which may lead outside the "
                               "dataset's directory (only relative links without '..' are kept)")
        dfd = self._dir(parts[:-1], create=True)
        self._vacate(dfd, parts[-1])
        os.symlink(target, parts[-1], dir_fd=dfd)

    def hardlink(self, parts: tuple[str, ...], source: tuple[str, ...]) -> None:
        """A hard link at `parts` to the member `source` already written (never a file outside the tree)."""
        sfd = os.dup(self._dir(source[:-1], create=False))
        try:
            try:
                os.stat(source[-1], dir_fd=sfd, follow_symlinks=False)
            except FileNotFoundError:
                raise UnsafeMember(f"member {'/'.join(parts)!r} is a hard link to {'/'.join(source)!r}, which the "
                                   "archive did not hold before it") from None
            dfd = self._dir(parts[:-1], create=True)
            self._vacate(dfd, parts[-1])
            os.link(source[-1], parts[-1], src_dir_fd=sfd, dst_dir_fd=dfd, follow_symlinks=False)
        finally:
            os.close(sfd)
