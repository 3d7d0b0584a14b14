"""Where a trace is: the JSONL files or Parquet datasets that command-line arguments name, for every engine.

Rules of this file:

* Locations are strings, never ``pathlib.Path``: a URI keeps its scheme and authority (``s3a://b/x`` stays
  ``s3a://b/x``), and ``/events`` is appended to a trace directory by string, for a URI as for a local path.
* An argument names a JSONL file (``*.jsonl``), a Parquet file, a trace directory (one holding ``events/``), a
  Parquet dataset (a directory with ``*.parquet`` below it) or a directory of JSONL files (searched recursively).
  JSONL and Parquet are not mixed in one check. A missing path, or a directory with neither, is an ``InputError``
  (exit 2), as is a Parquet file whose columns are not ``format.FLAT_SCHEMA``'s.
* A JSONL file is shown (``invalid`` entries' ``where``, evidence's ``file``) as the argument that named it, joined
  with ``/`` and its path below that argument; files are read in the order of those names.
* The oracle and DuckDB read local paths and ``file:`` URIs (``LocalFS``); Spark reads any Hadoop filesystem URI and
  asks the session's Hadoop ``FileSystem`` what exists (``HadoopFS``). A ``file:`` URI names the local path its
  percent-escapes decode to in every engine; another scheme's text is Hadoop's (read literally).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


class InputError(Exception):
    """The input cannot be checked at all: a missing path, no trace files, unreadable or mistyped Parquet, more
    nodes than the checks hold."""


def check_node_count(nodes: int) -> None:
    """Raise ``InputError`` when a trace's valid events name more than ``trace_nodes_max`` nodes (E-52), which every
    engine refuses alike before any verdict."""
    from .validity import MAX_NODES

    if nodes > MAX_NODES:
        raise InputError(f"the trace's valid events name {nodes:,} nodes; the checks hold at most {MAX_NODES:,} "
                         "(spec/tables/limits.yaml trace_nodes_max, E-52): check it one mesh at a time")


@dataclass(frozen=True)
class JsonlFile:
    location: str  # what the engine opens
    display: str  # what reports show


@dataclass(frozen=True)
class Trace:
    """JSONL files in path order, or Parquet datasets (each a root and its files)."""

    jsonl: tuple[JsonlFile, ...] = ()
    datasets: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def is_jsonl(self) -> bool:
        return bool(self.jsonl)

    @property
    def parquet_files(self) -> list[str]:
        return [f for _, files in self.datasets for f in files]


def has_scheme(text: str) -> bool:
    return bool(_SCHEME.match(text)) and not re.match(r"^[A-Za-z]:[\\/]", text)


def file_uri_path(text: str) -> str | None:
    """The local path a ``file:`` URI (no authority, or ``localhost``) names, its percent-escapes decoded; None for
    any other text."""
    parts = urlsplit(text)
    if parts.scheme.lower() == "file" and parts.netloc in ("", "localhost"):
        return unquote(parts.path)
    return None


def local(text: str, engine: str) -> str:
    """A local path or ``file:`` URI as a local path; another scheme is an ``InputError`` naming ``engine``."""
    if not has_scheme(text):
        return text
    path = file_uri_path(text)
    if path is None:
        where = "the report is written to" if engine == "report" else f"the {engine} engine reads"
        raise InputError(f"{where} local paths and file:// URIs only, not {text} "
                         "(use --engine spark for Hadoop filesystems)")
    return path


def join(base: str, name: str) -> str:
    return base if not name else base.rstrip("/") + "/" + name


class LocalFS:
    """The local filesystem; arguments may be ``file:`` URIs."""

    def __init__(self, engine: str):
        self.engine = engine

    def path(self, text: str) -> str:
        return local(text, self.engine)

    def exists(self, text: str) -> bool:
        return os.path.exists(self.path(text))

    def is_dir(self, text: str) -> bool:
        return os.path.isdir(self.path(text))

    def files(self, text: str) -> list[tuple[str, str]]:
        """(location, path below ``text``) of every file under directory ``text``. Raises ``InputError`` for an
        entry no engine could read alike: a symbolic link to a directory anywhere in the tree (Hadoop follows it,
        into a loop when it links back, and a walk of the tree does not: name the directory itself); and outside
        names starting with ``.`` or ``_``, which are skipped, a name that is not UTF-8 (Hadoop does not list it)
        or a symbolic link to nothing."""
        root = self.path(text)
        found = []
        for directory, subdirectories, names in os.walk(root):
            for name in [*subdirectories, *names]:
                full = os.path.join(directory, name)
                shown = os.fsencode(full).decode("utf-8", "backslashreplace")
                if name in subdirectories and os.path.islink(full):
                    raise InputError(f"{shown}: a symbolic link to a directory inside a trace directory (Hadoop "
                                     f"would follow it, the other engines would not); name the directory itself")
                relative = os.path.relpath(full, root).replace(os.sep, "/")
                if name in subdirectories or _hidden(relative):
                    continue
                if shown != full:
                    raise InputError(f"{shown}: a name that is not UTF-8 (Spark's Hadoop cannot list it); rename it")
                if os.path.islink(full) and not os.path.exists(full):
                    raise InputError(f"{full}: a symbolic link to nothing")
                found.append((full, relative))
        return found

    def location(self, text: str) -> str:
        return self.path(text)

    @staticmethod
    def identity(location: str) -> str:
        """What two names of one file share: its device and inode (symbolic and hard links, ``..``, any spelling).
        A trace file must be a regular file: reading a FIFO would wait for a writer."""
        found = os.stat(location)
        if not stat.S_ISREG(found.st_mode):
            raise InputError(f"{location}: not a regular file (a FIFO, device or socket is not a trace file)")
        return f"{found.st_dev}:{found.st_ino}"


class HadoopFS:
    """The session's Hadoop filesystems (any URI the cluster can read)."""

    def __init__(self, spark: Any):
        self.jvm = spark._jvm
        self.conf = spark._jsc.hadoopConfiguration()

    @staticmethod
    @contextlib.contextmanager
    def failing(text: str, doing: str = "read") -> Iterator[None]:
        """Hadoop's exceptions about ``text`` (no filesystem for its scheme, one it cannot set up or reach, a denied
        or failed operation) as ``InputError``: the input is unusable, which is no verdict about it."""
        from py4j.protocol import Py4JJavaError
        from pyspark.errors.exceptions.captured import CapturedException

        try:
            yield
        except (Py4JJavaError, CapturedException) as exc:  # PySpark turns some Java exceptions into its own
            java = exc.java_exception if isinstance(exc, Py4JJavaError) else getattr(exc, "_origin", None)
            message = (str(exc) if java is None else str(java.toString())).splitlines()[0]
            raise InputError(f"{text}: Hadoop cannot {doing} it: {message} (a filesystem's settings are given as "
                             f"--conf spark.hadoop.KEY=VALUE)") from None

    def _fs(self, text: str) -> tuple[Any, Any]:
        """The filesystem and Hadoop ``Path`` an argument names. Hadoop reads a path's text literally (``%3D`` is
        three characters); a local ``file:`` URI names the path its percent-escapes decode to, as ``LocalFS`` reads
        it, so every engine reads (and writes) the same file. Call it inside ``failing``."""
        decoded = file_uri_path(text) if has_scheme(text) else None
        if decoded is not None:  # relative (file:x) as the local engines read it: from the working directory
            path = self.jvm.org.apache.hadoop.fs.Path("file", None, os.path.abspath(decoded))
        else:
            path = self.jvm.org.apache.hadoop.fs.Path(text)
        return path.getFileSystem(self.conf), path

    def exists(self, text: str) -> bool:
        with self.failing(text):
            fs, path = self._fs(text)
            return bool(fs.exists(path))

    def is_dir(self, text: str) -> bool:
        with self.failing(text):
            fs, path = self._fs(text)
            return bool(fs.exists(path) and fs.getFileStatus(path).isDirectory())

    def files(self, text: str) -> list[tuple[str, str]]:
        if not has_scheme(text) or file_uri_path(text) is not None:
            LocalFS("spark").files(text)  # a local tree's entries no engine reads alike are refused as everywhere
        with self.failing(text):
            fs, path = self._fs(text)
            root = fs.makeQualified(path).toString().rstrip("/") + "/"
            found = []
            listing = fs.listFiles(path, True)
            while listing.hasNext():
                child = listing.next().getPath()
                name = child.toString()
                found.append((child.toUri().toString(), name[len(root):] if name.startswith(root) else child.getName()))
            return found

    def location(self, text: str) -> str:
        with self.failing(text):
            fs, path = self._fs(text)
            return fs.makeQualified(path).toUri().toString()

    @staticmethod
    def identity(location: str) -> str:
        """What two spellings of one file share: for a local file its device and inode, as ``LocalFS`` reads it
        (so every engine reads a hard-linked file once), else its qualified URI."""
        path = file_uri_path(location)
        return location if path is None else LocalFS.identity(path)


@contextlib.contextmanager
def spark_read_failures() -> Iterator[None]:
    """A Spark job that failed reading a trace file (``FAILED_READ_FILE``: a corrupt Parquet page behind an intact
    footer, a file gone or changed since it was listed) as ``InputError``, as the other engines report it."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors.exceptions.captured import CapturedException

    try:
        yield
    except (Py4JJavaError, CapturedException) as exc:
        text = str(exc)
        failed = re.search(r"\[FAILED_READ_FILE[.A-Z_]*\] Encountered error while reading file (\S+?)\.?\s", text)
        if failed is None:
            raise
        causes = re.findall(r"Caused by: ([^\n]+)", text)
        what = "Parquet file" if failed.group(1).endswith(".parquet") else "file"
        raise InputError(f"{failed.group(1)}: not a readable {what} ({causes[-1] if causes else 'Spark failed'})"
                         ) from None


def _hidden(relative: str) -> bool:
    return any(part.startswith((".", "_")) for part in relative.split("/"))


def locate(arguments: Iterable[str], fs: LocalFS | HadoopFS) -> Trace:
    """The trace the arguments name; raises ``InputError`` when there is none. A file named twice (by two arguments,
    or a directory and a file in it, in any spelling the filesystem resolves alike) is read once."""
    jsonl: dict[str, JsonlFile] = {}
    datasets: list[tuple[str, tuple[str, ...]]] = []
    seen: set[str] = set()

    def fresh(location: str) -> bool:
        key = fs.identity(location)
        new = key not in seen
        seen.add(key)
        return new

    for argument in arguments:
        argument = str(argument)
        scheme, _, rest = argument.partition(":")
        if has_scheme(argument) and not rest.startswith("/") and os.path.lexists(argument):
            raise InputError(f"{argument}: read as a URI of scheme {scheme!r}, yet a local path of that name exists; "
                             f"a local path whose first part holds ':' is written ./{argument}")
        if not fs.exists(argument):
            raise InputError(f"no such file or directory: {argument}")
        if not fs.is_dir(argument):
            if argument.endswith(".jsonl"):
                if fresh(fs.location(argument)):
                    jsonl.setdefault(argument, JsonlFile(fs.location(argument), argument))
            elif argument.endswith(".parquet"):
                if fresh(fs.location(argument)):
                    datasets.append((argument, (fs.location(argument),)))
            else:
                raise InputError(f"{argument}: neither a .jsonl nor a .parquet file")
            continue
        events = join(argument, "events")
        root = events if fs.is_dir(events) else argument
        if root == events:  # a trace directory: its events are in events/, and no trace file may sit beside it
            beside = sorted(rel for _, rel in fs.files(argument) if not _hidden(rel) and not rel.startswith("events/")
                            and rel.endswith((".jsonl", ".parquet")))
            if beside:
                raise InputError(f"{argument}: {beside[0]}{f' and {len(beside) - 1} more' if len(beside) > 1 else ''}"
                                 f": a trace file outside events/ (a trace directory's events are all in events/; "
                                 f"name events/ itself, or the files, to check them)")
        files = [(loc, rel) for loc, rel in fs.files(root) if not _hidden(rel)]
        stray = sorted(rel for _, rel in files if not rel.endswith((".jsonl", ".parquet")))
        if stray:  # a trace directory holds trace files only: a misnamed file would be a node left out unseen
            raise InputError(f"{root}: {stray[0]}{f' and {len(stray) - 1} more' if len(stray) > 1 else ''}: neither "
                             f"a .jsonl nor a .parquet file (a trace directory holds trace files only; names "
                             f"starting with . or _ are skipped)")
        parquet = sorted(loc for loc, rel in files if rel.endswith(".parquet"))
        found = sorted((rel, loc) for loc, rel in files if rel.endswith(".jsonl"))
        if parquet and found:
            raise InputError(f"{root} holds both JSONL and Parquet files: check one trace at a time (meshtrace "
                             f"convert turns JSONL into a Parquet dataset)")
        if parquet:
            unread = tuple(loc for loc in parquet if fresh(loc))
            if unread:
                datasets.append((root, unread))
            continue
        if not found:
            raise InputError(f"no trace files (*.jsonl or *.parquet) in {argument}")
        for rel, loc in found:
            display = join(argument, rel)
            if fresh(loc):
                jsonl.setdefault(display, JsonlFile(loc, display))
    if jsonl and datasets:
        raise InputError("JSONL files and Parquet datasets cannot be checked together; convert the JSONL first "
                         "(meshtrace convert)")
    return Trace(tuple(jsonl[k] for k in sorted(jsonl)), tuple(datasets))


def write_local(target: str, text: str) -> None:
    """Write ``text`` to a local path or ``file:`` URI, making its directory; raises ``InputError`` when the system
    refuses."""
    path = local(target, "report")
    directory = os.path.dirname(path)
    try:
        if os.path.exists(path) and not os.path.isfile(path):  # a directory, or a FIFO that would block
            raise InputError(f"{target}: cannot write it: not a regular file")
        if directory:
            os.makedirs(directory, exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
    except FileExistsError as exc:  # makedirs met a file where a directory belongs
        raise InputError(f"{target}: cannot write it: {exc.filename} is not a directory") from None
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename not in (None, path) else ""
        raise InputError(f"{target}: cannot write it: {exc.strerror or exc}{where}") from None
    except ValueError as exc:  # a NUL byte
        raise InputError(f"{target}: cannot write it: {exc}") from None


def write_hadoop(spark: Any, target: str, text: str) -> None:
    """Write ``text`` to any Hadoop filesystem URI (or local path) through the session's ``FileSystem``; raises
    ``InputError`` when Hadoop cannot."""
    hadoop = HadoopFS(spark)
    with hadoop.failing(target, "write"):
        fs, path = hadoop._fs(target)
        stream = fs.create(path, True)
        try:
            stream.write(bytearray(text.encode("utf-8")))
        finally:
            stream.close()


# --- Parquet column types -----------------------------------------------------------------------------------------

def flat_type_problems(columns: dict[str, str], where: str) -> list[str]:
    """Problems of one Parquet file's columns (name -> arrow type text) against ``format.FLAT_SCHEMA``."""
    from .format import FLAT_SCHEMA

    problems = []
    for field in FLAT_SCHEMA:
        found = columns.get(field.name)
        if found is None:
            problems.append(f"{where}: column {field.name} missing (expected {field.type})")
        elif found != str(field.type):
            problems.append(f"{where}: column {field.name} is {found}, expected {field.type}")
    extra = sorted(set(columns) - set(FLAT_SCHEMA.names))
    if extra:
        problems.append(f"{where}: column(s) {', '.join(extra)} not in the trace layout")
    return problems


#: Arrow's other layouts of one Parquet string column: what the file stores is a string either way (the file's
#: ARROW:schema, which only pyarrow reads, names the layout its writer held in memory), so every engine reads it
#: as ``string``, as Spark, which reads the Parquet column itself, always did.
STRING_LAYOUTS = frozenset({"large_string", "string_view"})


def arrow_type_text(kind: Any) -> str:
    """The type a Parquet column read by pyarrow stands for in the flat layout: a dictionary's values, and
    ``string`` for every string layout."""
    import pyarrow as pa

    text = str(kind.value_type if pa.types.is_dictionary(kind) else kind)
    return "string" if text in STRING_LAYOUTS else text


def check_local_parquet(files: Iterable[str]) -> None:
    """Raise ``InputError`` when a Parquet file cannot be read or its columns are not the flat layout's."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    problems: list[str] = []
    for path in files:
        try:
            schema = pq.read_schema(path)
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"{path}: not a readable Parquet file ({exc})") from None
        columns = {f.name: arrow_type_text(f.type) for f in schema}
        problems += flat_type_problems(columns, path)
    if problems:
        raise InputError("Parquet columns do not match the trace layout: " + "; ".join(problems[:5])
                         + (f"; and {len(problems) - 5} more" if len(problems) > 5 else ""))


#: bytes of a JSONL line, at the least, for `estimated_events` (a generated event's line is 250-400): an estimate
#: that errs, errs toward more events
JSONL_BYTES_PER_EVENT = 200


def estimated_events(arguments: Iterable[str]) -> int | None:
    """How many events the trace ``arguments`` name holds, when every argument is local and the files say without
    being read: a Parquet file's row count from its footer, a JSONL file's size over `JSONL_BYTES_PER_EVENT`. None
    for a Hadoop URI, or input the check itself will refuse (its error is the read's to give)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        trace = locate(arguments, LocalFS("estimate"))
        events = sum(os.path.getsize(f.location) // JSONL_BYTES_PER_EVENT for f in trace.jsonl)
        return events + sum(pq.read_metadata(path).num_rows for path in trace.parquet_files)
    except (InputError, OSError, ValueError, pa.ArrowException):  # ValueError: a NUL in a path, Arrow's invalid data
        return None


__all__ = ["HadoopFS", "InputError", "JsonlFile", "LocalFS", "Trace", "check_local_parquet", "check_node_count",
           "estimated_events", "local", "locate", "write_hadoop", "write_local"]
