"""Where a job or a tool reads and writes: one spelling of a path, gs:// paths of Cloud Storage's form, output
prefixes (`PREFIX-*`) and the single files tools write, each refused in one line naming its flag."""

from __future__ import annotations

import glob
import os
import re

from apache_beam.io.filesystems import FileSystems
from apache_beam.io.localfilesystem import LocalFileSystem

from pipeline.errors import JobConfigError


def one_spelling(path: str) -> str:
    """One spelling of a path or prefix (`./`, `//`, a relative local path against an absolute one, a symbolic link)."""
    path = path.rstrip("/")
    if "://" in path:
        scheme, rest = path.split("://", 1)
        return f"{scheme}://{os.path.normpath('/' + rest)[1:]}"
    return os.path.realpath(path)  # (links resolved; no ~: Beam's local file system takes it as a name)


def same_prefix(a: str, b: str) -> bool:
    """Whether two spellings of an output prefix name the same files."""
    return one_spelling(a) == one_spelling(b)


_GS = re.compile(r"gs://([a-z0-9][a-z0-9._-]{1,220}[a-z0-9])(/.*)?")


def check_gs_path(flag: str, path: str, names_object: bool = True) -> None:
    """A gs:// path of Cloud Storage's form (a bucket of 3 or more lowercase letters, digits, -, _ and ., and an
    object where a file or prefix is named): Beam and the storage client met a malformed one only after their
    credential retries, in tracebacks or after two minutes."""
    if not path.startswith("gs://"):
        return
    m = _GS.fullmatch(path)
    if m is None:
        raise JobConfigError(f"{flag} {path!r}: not a Cloud Storage path (gs://BUCKET/OBJECT, the bucket of 3 or more "
                             "lowercase letters, digits, -, _ and .)")
    if names_object and not (m.group(2) or "/").strip("/"):
        raise JobConfigError(f"{flag} {path!r}: names a bucket, not files in it: say {path.rstrip('/')}/run1/gens")


def check_prefix(flag: str, prefix: str, example: str = "gens", written: bool = True) -> None:
    """A prefix names files by globbing (`PREFIX-*`): glob characters would match other files, and
    one ending in `-failed` would take another run's failed files for its results; a comma would split it where
    several prefixes are read (`--resume_from`, `pipeline.report`); one that names a folder (ending in /, or
    `written`, an existing local folder with no `PREFIX-*` files: `.`, '') or nothing would write beside the
    folder, as its name's files."""
    if not prefix.strip():
        raise JobConfigError(f"{flag} {prefix!r}: names no files: say DIR/{example} for the files DIR/{example}-*")
    check_gs_path(flag, prefix)
    if prefix.lower().endswith(".parquet"):  # (it wrote p.parquet-00000-of-00001.parquet)
        raise JobConfigError(f"{flag} {prefix!r}: a prefix, not a file's name (its files are "
                             f"PREFIX-00000-of-00001.parquet): say {prefix[:-8]}")
    if any(c in prefix for c in "*?[,"):
        raise JobConfigError(f"{flag} {prefix!r}: a prefix cannot hold *, ?, [ or , (its files are found by "
                             "pattern, and several prefixes are written joined by commas)")
    local = os.path.expanduser(prefix)
    if prefix.endswith("/") or (written and "://" not in prefix and os.path.isdir(local)
                                and not glob.glob(f"{glob.escape(local)}-*")):
        folder = prefix if prefix.endswith("/") else f"{prefix}/"
        raise JobConfigError(f"{flag} {prefix!r}: a prefix names files (PREFIX-00000-of-00001.parquet), not a "
                             f"folder: say {folder}{example} for the files {folder}{example}-*")
    if os.path.basename(prefix.rstrip("/")).endswith(("-failed", "-chunk")):
        raise JobConfigError(f"{flag} {prefix!r}: a prefix cannot end in -failed or -chunk (PREFIX-failed-* and "
                             "PREFIX-chunk-* name a run's failed rows and chunks)")


def check_local_folder(flag: str, prefix: str) -> None:
    """The writers make a local prefix's missing folders; a file where a folder must be failed the job only when it
    began to write, in a traceback."""
    if not isinstance(FileSystems.get_filesystem(prefix), LocalFileSystem):
        return
    nearest = os.path.dirname(os.path.abspath(prefix))
    while not os.path.exists(nearest):
        nearest = os.path.dirname(nearest)
    if not os.path.isdir(nearest):
        raise JobConfigError(f"{flag} {prefix!r}: {nearest} is a file, where the output's folder must be")
    if not os.access(nearest, os.W_OK | os.X_OK):
        raise JobConfigError(f"{flag} {prefix!r}: this process cannot write in {nearest}")


def writable_file(flag: str, path: str) -> str:
    """A local file a tool writes when its work is done, checked before the work (`~` expanded): named, not a folder
    nor a Parquet file (a run's shard or a tool's input, which the page or JSON would replace), in a folder this
    process can write (missing folders are made). gs:// files are left to their writer."""
    if not path.strip():
        raise JobConfigError(f"{flag} {path!r}: names no file")
    if path == "-":
        raise JobConfigError(f"{flag} '-': this writes a file, not standard output: name the file")
    if path.lower().endswith(".parquet"):
        raise JobConfigError(f"{flag} {path!r}: a Parquet file's name (this writes {flag[2:]} there, in its place)")
    if "://" in path:
        check_gs_path(flag, path)
        return path
    path = os.path.expanduser(path)
    if os.path.isdir(path):
        raise JobConfigError(f"{flag} {path!r}: a folder, not a file")
    check_local_folder(flag, path)
    return path
