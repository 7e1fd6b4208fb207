"""File operations that work the same on local paths and on any URL tf.io.gfile knows (gs://,
and s3:// where a plugin such as tensorflow-io registers it).

Local paths take the plain os/pathlib route (no TensorFlow import, so bad input fails fast);
URLs go through tf.io.gfile. Paths are strings: pathlib would turn gs://b/x into gs:/b/x.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import posixpath
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

from app import safe_json
from app.errors import UserError
from app.safe_json import JsonLimits, JsonRejected


def cache_root() -> Path:
    """This user's photoclf cache: $PHOTOCLF_CACHE_DIR, else $XDG_CACHE_HOME/photoclf, else
    ~/.cache/photoclf (the feature store, the runtimes measured on this host)."""
    base = os.environ.get("PHOTOCLF_CACHE_DIR")
    if not base:
        base = str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "photoclf")
    return Path(base).expanduser()


def is_url(path: str | Path) -> bool:
    return "://" in str(path)


def _gfile():
    import tensorflow as tf

    return tf.io.gfile


def join(base: str | Path, *names: str) -> str:
    return posixpath.join(str(base), *names) if is_url(base) else os.path.join(base, *names)


def check_url(path: str | Path, flag: str) -> None:
    """A clear one-line error for a URL whose file system TensorFlow lacks or cannot reach."""
    if not is_url(path):
        return
    import tensorflow as tf

    scheme = str(path).split("://")[0]
    try:
        try:
            tf.io.gfile.exists(str(path))
        except tf.errors.UnimplementedError:
            _load_file_system_plugins()
            tf.io.gfile.exists(str(path))
    except tf.errors.UnimplementedError:
        hint = " (s3:// needs a file-system plugin: `pip install tensorflow-io`)" if scheme == "s3" else ""
        raise UserError(f"{flag}: TensorFlow has no file system for {scheme}:// here{hint}") from None
    except tf.errors.OpError as err:
        raise UserError(f"{flag}: cannot reach {path} ({err.message.strip().splitlines()[0]})") from None


def _load_file_system_plugins() -> None:
    """tensorflow-io registers s3:// (and more) when imported; it is optional."""
    with contextlib.suppress(ImportError):
        import tensorflow_io  # noqa: F401


def must_exist(path: Path) -> None:
    """A UserError naming `path` when it is not there; for scripts to say so before importing TensorFlow."""
    if not Path(path).exists():
        raise UserError(f"{path}: no such file or folder")


def check_output_folder(path: str | Path, flag: str) -> None:
    """Refuse, naming `flag`, a folder to write into that cannot be one (a file, a path under a
    file, or under a folder that refuses new files), before the work whose results it would hold.
    A URL is left to its write."""
    if is_url(path):
        return
    path = Path(path)
    blocker = next((p for p in (path, *path.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise UserError(f"{flag} {path}: {blocker} is a file, not a folder")
    if blocker is not None:
        _check_writable(blocker, f"{flag} {path}")


def check_output_file(path: str | Path, flag: str) -> None:
    """Refuse, naming `flag`, a file to write whose folder does not exist, refuses new files (read
    only, no permission) or that is a folder."""
    path = Path(path)
    if path.parent.exists() and not path.parent.is_dir():
        raise UserError(f"{flag} {path}: {path.parent} is a file, not a folder")
    if not path.parent.is_dir():
        raise UserError(f"{flag} {path}: folder {path.parent} does not exist")
    if path.is_dir():
        raise UserError(f"{flag} {path}: is a folder; give the file to write, e.g. {path / 'out.csv'}")
    _check_writable(path.parent, f"{flag} {path}")


def _check_writable(folder: Path, named: str) -> None:
    """Results are written last, after all the work: a folder that refuses new files (read only,
    no permission) is said now, by creating and removing an empty file in it."""
    probe = folder / f".tmp-{uuid.uuid4().hex[:8]}-probe"
    try:
        probe.touch(exist_ok=False)
    except OSError as err:
        raise UserError(f"{named}: cannot write in {folder} ({err.strerror or err})") from None
    probe.unlink()


def exists(path: str | Path) -> bool:
    return _gfile().exists(str(path)) if is_url(path) else os.path.exists(path)


def isdir(path: str | Path) -> bool:
    return _gfile().isdir(str(path)) if is_url(path) else os.path.isdir(path)


def makedirs(path: str | Path) -> list[Path]:
    """The folder and its missing parents; returns those it made (`missing_folders`)."""
    created = missing_folders(path)
    if is_url(path):
        _gfile().makedirs(str(path))
    else:
        os.makedirs(path, exist_ok=True)
    return created


def missing_folders(path: str | Path) -> list[Path]:
    """The folders of a local `path` that do not exist yet, innermost first: what writing it creates."""
    if is_url(path):
        return []
    path = Path(path)
    return [folder for folder in (path, *path.parents) if not folder.exists()]


def remove_if_empty(folders: list[Path]) -> None:
    """Remove each folder (innermost first) where nothing was written in it: a failed first write
    leaves no empty folder for a later step to find."""
    for folder in folders:
        with contextlib.suppress(OSError):  # not empty (or gone): kept
            folder.rmdir()


def listdir(path: str | Path) -> list[str]:
    """Entry names (no trailing slashes), or [] when `path` is not a folder."""
    if not isdir(path):
        return []
    names = _gfile().listdir(str(path)) if is_url(path) else os.listdir(path)
    return sorted(name.rstrip("/") for name in names)


def read_text(path: str | Path) -> str:
    if is_url(path):
        with _gfile().GFile(str(path), "r") as f:
            return f.read()
    return Path(path).read_text()


JSON_FILE_LIMITS = JsonLimits(max_bytes=256 * 2**20, max_values=2**27)  # files photoclf writes: depth is what matters


def read_json_object(path: str | Path) -> dict:
    """A JSON file that must hold an object (dataset.json, a run's state and config): anything
    else is one line naming the file, not a stack trace."""
    if not is_url(path) and Path(path).stat().st_size > JSON_FILE_LIMITS.max_bytes:
        raise UserError(f"{path}: larger than {JSON_FILE_LIMITS.max_bytes} bytes; not a file photoclf wrote")
    try:
        data = safe_json.loads(read_bytes(path), JSON_FILE_LIMITS)
    except JsonRejected as err:
        raise UserError(f"{path}: {err}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def read_bytes(path: str | Path) -> bytes:
    if is_url(path):
        with _gfile().GFile(str(path), "rb") as f:
            return f.read()
    return Path(path).read_bytes()


def is_out_of_space(err: BaseException) -> bool:
    """ENOSPC or EDQUOT from Python, or TensorFlow's words for it (its file errors carry no errno)."""
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return isinstance(err, Exception) and "No space left on device" in str(err)


@contextlib.contextmanager
def space_named(path: str | Path) -> Iterator[None]:
    """Running out of space inside the block becomes one line naming `path`; the caller's
    cleanup (a temp name, a staging folder) has left nothing half-written where a reader looks."""
    try:
        yield
    except Exception as err:
        if is_out_of_space(err):
            raise UserError(
                f"{path}: no space left on the device; nothing half-written was kept."
                " Free some space and run the same command again"
            ) from None
        raise


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[str]:
    """Yield a hidden temp name beside `path` to write to; on success it is renamed over `path`,
    so readers see the old content or the new, never half (atomic on POSIX; on object stores each
    object appears whole). The temp name keeps `path`'s suffixes, for writers that check them
    (Keras wants `.weights.h5`, matplotlib infers the format). On failure the temp file is removed."""
    directory, name = posixpath.split(str(path)) if is_url(path) else os.path.split(str(path))
    tmp = join(directory or ".", f".tmp-{uuid.uuid4().hex[:8]}-{name}")
    with space_named(path):
        try:
            yield tmp
            rename(tmp, path)
        except BaseException:
            remove(tmp)
            raise


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        if is_url(tmp):
            with _gfile().GFile(tmp, "wb") as f:
                f.write(data)
        else:
            Path(tmp).write_bytes(data)


def write_text_atomic(path: str | Path, text: str) -> None:
    write_bytes_atomic(path, text.encode())


def write_json_atomic(path: str | Path, data: object) -> None:
    """`data` as indented JSON, written as it is encoded: a report of millions of entries is never
    held as one string (nor as the pieces it is joined from) beside the data."""
    with atomic_path(path) as tmp, _gfile().GFile(tmp, "w") if is_url(tmp) else open(tmp, "w") as f:
        json.dump(data, f, indent=2, default=str)
        f.write("\n")


def rename(src: str | Path, dst: str | Path) -> None:
    """Move `src` over `dst` (replacing it)."""
    if is_url(src):
        _gfile().rename(str(src), str(dst), overwrite=True)
    else:
        os.replace(src, dst)


def remove(path: str | Path) -> None:
    """Delete a file if it is there."""
    if is_url(path):
        if _gfile().exists(str(path)):
            _gfile().remove(str(path))
    else:
        Path(path).unlink(missing_ok=True)


def rmtree(path: str | Path) -> None:
    """Delete a folder and everything in it, if it is there."""
    if is_url(path):
        if _gfile().exists(str(path)):
            _gfile().rmtree(str(path))
    else:
        shutil.rmtree(path, ignore_errors=True)


def make_temp_dir(parent: str | Path, prefix: str) -> str:
    """A new, uniquely named folder inside `parent`."""
    path = join(parent, f"{prefix}{uuid.uuid4().hex[:12]}")
    makedirs(path)
    return path


def flock_folder(path: Path) -> int | None:
    """An open descriptor of the local folder `path` holding an exclusive flock on it (let go when
    it is closed, or the process ends however it ends); None where flock does not exist (not
    POSIX). BlockingIOError when another process holds it."""
    try:
        import fcntl
    except ImportError:
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def claimed(path: str | Path, refusal: str) -> Iterator[None]:
    """The local folder `path` held for this process while the body runs: another process that
    claims it meanwhile gets UserError(`refusal`). A URL is not claimed."""
    try:
        fd = None if is_url(path) else flock_folder(Path(path))
    except BlockingIOError:
        raise UserError(refusal) from None
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)
