r"""A resumable, crash-safe store of sweep results: one Parquet file per point.

Layout of a store folder::

    STORE/store.json              format version and the task's name (claimed once)
    STORE/points/<key>.parquet    one row per finished point (written atomically)
    STORE/arrays/<key>.npz        the point's arrays, if the task returned any
    STORE/table.parquet           consolidated cache of the rows (rebuildable)
    STORE/damaged/                point files that could not be read, moved aside

``key`` is the SHA-256 (first 32 hex digits) of the canonical JSON of
``(task name, task version, all parameters with defaults filled in)``
(:func:`point_key`), so a point is identified by what it computes and the same
point is never stored twice.

Why it is atomic and duplicate-free
-----------------------------------
Every file is written to a temporary name in the destination folder, flushed
and fsync'ed, then renamed over its final name with :func:`os.replace`
(atomic on POSIX file systems).  A process killed at any moment therefore
leaves either the complete file or none (plus, at worst, a ``.tmp-*`` file
that readers ignore and the next sweep removes); a point's arrays are written
before its row, so a row never points to missing arrays.  Since a file's name
is its key, a point rewritten (e.g. ``retry_errors``) replaces its old row
instead of adding one.  ``table.parquet`` is only a cache: a row is read from
it when the point file's bytes have the SHA-256 recorded with that row in the
cache (content, not a modification time, which copies and quick edits keep),
and from the point file otherwise, so a stale, missing or edited cache never
loses, duplicates or alters a row.

One task per store, claimed atomically
--------------------------------------
A new store is claimed by writing its complete ``store.json`` under a
temporary name and hard-linking it to ``store.json``: the link fails when the
name exists, so of several sweeps that open one new folder at the same moment
exactly one creates the store, and the others read its task and are refused
if theirs differs (where the file system has no hard links, ``O_EXCL``
creation decides instead).  A non-empty folder that is not a store is
refused, never filled.

Damaged files never block a store
---------------------------------
A point file that cannot be read back (truncated by a full disk, zeroed by a
crash of the file system, edited) is skipped with a warning; a sweep moves it
to ``damaged/`` and computes the point again.  Results the store could not
read back are refused when the task returns them (see
:func:`symquad.studies.sweep.run_point`), so they never reach the disk.

Only the process that drives a sweep writes (workers return their results to
it), so a store needs no shared file system when the workers run elsewhere.
"""

from __future__ import annotations

import glob
import hashlib
import json
import math
import os
import tempfile
import time
import uuid
import warnings
from numbers import Integral, Real

import numpy as np

from .._atomic import TMP_PREFIX, _FILE_MODE, atomic_file, remove_stale, temp_owner, \
    temp_prefix
from .._safe_io import open_regular, read_npz, read_regular

__all__ = ["SweepStore", "point_key", "canonical_params", "load_sweep", "load_sweep_arrays",
           "META_COLUMNS"]

FORMAT = 1
#: columns the engine adds to every row (a task's results may not use these names)
META_COLUMNS = ("status", "error", "seconds", "finished_utc", "key", "task", "task_version",
                "arrays", "traceback")
#: column of table.parquet holding the SHA-256 of the point file a cached row was read from
_DIGEST = "_sha256"
_CONSOLIDATE_AFTER = 64       # rebuild the cache once this many rows are read from points/
#: integers a store holds exactly (Parquet int64)
INT64_RANGE = (-2**63, 2**63 - 1)


def _canonical(value, name):
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, Integral):
        value = int(value)
        if not INT64_RANGE[0] <= value <= INT64_RANGE[1]:
            raise ValueError(f"parameter {name!r} must be an integer in [-2**63, 2**63 - 1] "
                             f"(what a store holds exactly), got {value:.4g}")
        return value
    if isinstance(value, Real):
        v = float(value)
        if not math.isfinite(v):
            raise ValueError(f"parameter {name!r} must be finite, got {value!r}")
        return v
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"parameter {name!r} must be valid text (it holds an unpaired "
                             f"surrogate), got {value!r}") from None
        return value
    if value is None:
        return None
    if isinstance(value, (tuple, list)):
        return [_canonical(v, name) for v in value]
    raise TypeError(f"parameter {name!r} must be an int, float, str, bool, None or a tuple of "
                    f"those, got {type(value).__name__}")


def canonical_params(params: dict) -> dict:
    """Parameters as plain JSON values (numpy scalars to Python; NaN/inf rejected)."""
    return {str(k): _canonical(v, k) for k, v in params.items()}


def point_key(task_name: str, task_version: str, params: dict) -> str:
    """Hex key of one point: SHA-256 of ``{"task", "version", "params"}`` as canonical JSON.

    ``1`` and ``1.0`` are different parameters (they are different inputs to
    the task); all parameters, defaults included, enter the key.
    """
    blob = json.dumps({"task": task_name, "version": str(task_version),
                       "params": canonical_params(params)},
                      sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


class SweepStore:
    """A store folder (see the module docstring).

    Parameters
    ----------
    path : str or path-like
        Folder; created if missing.
    task : str, optional
        Task name.  A new store records it; an existing store must have been
        created for the same task (``ValueError`` otherwise).
    """

    def __init__(self, path, task=None):
        self.path = os.fspath(path)
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise ValueError(f"store {self.path!r} exists and is not a folder")
        meta_path = os.path.join(self.path, "store.json")
        if not os.path.lexists(meta_path):
            if task is None:
                raise FileNotFoundError(f"{self.path!r} is not a sweep store (no store.json)")
            os.makedirs(self.path, exist_ok=True)
            self._refuse_foreign_folder()
            self._claim(meta_path, {"format": FORMAT, "task": task})
        self.meta = self._read_meta(meta_path)
        if self.meta.get("format") != FORMAT:
            raise ValueError(f"store {self.path!r} has format {self.meta.get('format')}, "
                             f"this symquad reads format {FORMAT}")
        if task is not None and self.meta.get("task") != task:
            raise ValueError(f"store {self.path!r} holds task {self.meta.get('task')!r}, not "
                             f"{task!r}; use another folder")
        if task is not None:
            os.makedirs(os.path.join(self.path, "points"), exist_ok=True)
            os.makedirs(os.path.join(self.path, "arrays"), exist_ok=True)

    def __repr__(self):
        return f"SweepStore({self.path!r}, task={self.meta['task']!r})"

    # -- claiming a new store -------------------------------------------------
    def _refuse_foreign_folder(self):
        """ValueError if the folder holds anything but what a store being created holds."""
        foreign = []
        for entry in os.scandir(self.path):
            if temp_owner(entry.name, TMP_PREFIX) is not None:
                continue                          # another creator's store.json in flight
            if entry.name in ("points", "arrays") and entry.is_dir(follow_symlinks=False) \
                    and not os.listdir(entry.path):
                continue                          # left by an older symquad's creation
            foreign.append(entry.name)
        if foreign:
            raise ValueError(f"store {self.path!r} is a non-empty folder that is not a sweep "
                             f"store (no store.json; it holds {sorted(foreign)[:5]}); choose a "
                             f"new or empty folder")

    def _claim(self, meta_path, meta):
        """Create ``store.json`` holding `meta` unless it exists; True if this call created it.

        The complete file is written under a temporary name and hard-linked to
        ``store.json`` (``link`` fails if the name exists): exactly one of
        several concurrent creators succeeds and nobody sees a partial file.
        """
        data = json.dumps(meta, indent=1).encode()
        fd, tmp = tempfile.mkstemp(prefix=temp_prefix(TMP_PREFIX), suffix=".tmp", dir=self.path)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, _FILE_MODE)
            try:
                os.link(tmp, meta_path)
                return True
            except FileExistsError:
                return False
            except OSError:
                pass                  # no hard links here: exclusive creation decides
            try:
                out = os.open(meta_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE)
            except FileExistsError:
                return False
            with os.fdopen(out, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            return True
        finally:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass

    def _read_meta(self, meta_path):
        # a store.json created by O_EXCL (no hard links) can be empty for an instant
        for attempt in range(20):
            try:
                meta = json.loads(read_regular(meta_path, "store.json", max_bytes=2**20))
                if isinstance(meta, dict):
                    return meta
                problem = "not a JSON object"
            except (ValueError, UnicodeDecodeError) as exc:
                problem = str(exc)
            time.sleep(0.025)
        raise ValueError(f"store {self.path!r}: store.json is damaged ({problem}); it "
                         f"records the task of the store, restore it or use another folder")

    def _write_meta(self):
        # an existing store.json is replaced atomically (the task never changes)
        data = json.dumps(self.meta, indent=1).encode()
        with atomic_file(os.path.join(self.path, "store.json")) as fh:
            fh.write(data)

    def record_params(self, names):
        """Record the task's parameter names (column order of :func:`load_sweep`)."""
        if self.meta.get("params") != list(names):
            self.meta["params"] = list(names)
            self._write_meta()

    # -- paths ----------------------------------------------------------------
    def point_path(self, key):
        return os.path.join(self.path, "points", f"{key}.parquet")

    def arrays_path(self, key):
        return os.path.join(self.path, "arrays", f"{key}.npz")

    def keys(self) -> set:
        """Keys of the stored points (from the file names; cheap)."""
        return {os.path.basename(p)[:-8]
                for p in glob.glob(os.path.join(self.path, "points", "*.parquet"))}

    def remove_stale_temporaries(self):
        """Delete ``.tmp-*`` files left by dead processes of this host (see :mod:`symquad._atomic`)."""
        for sub in ("points", "arrays", "."):
            remove_stale(os.path.join(self.path, sub), TMP_PREFIX)

    # -- writing --------------------------------------------------------------
    def write(self, row: dict, arrays: dict | None = None):
        """Store one point: its arrays first (if any), then its row, each atomically."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        key = row["key"]
        row = dict(row)
        if arrays:
            path = self.arrays_path(key)
            with atomic_file(path) as fh:
                np.savez(fh, **arrays)
            row["arrays"] = os.path.relpath(path, self.path)
        table = pa.Table.from_pylist([row])
        with atomic_file(self.point_path(key)) as fh:
            pq.write_table(table, fh)

    # -- reading --------------------------------------------------------------
    @staticmethod
    def _point_bytes(path):
        """The bytes of a point file and their SHA-256 (what the cache is checked against)."""
        with open_regular(path, "point file", max_bytes=2**30) as fh:
            data = fh.read()
        return data, hashlib.sha256(data).hexdigest()

    def _read_point(self, path, key, data=None):
        """The row stored in one point file; ValueError if the file cannot be read back."""
        import io

        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            if data is None:
                data, _ = self._point_bytes(path)
            # one-row tables: no reader threads (Arrow's pool, torn down at interpreter
            # exit while a worker is alive, aborted a finished sweep once with "terminate
            # called without an active exception"; apache/arrow#34314)
            rows = pq.read_table(io.BytesIO(data), use_threads=False).to_pylist()
        except (OSError, pa.ArrowException) as exc:
            raise ValueError(f"{type(exc).__name__}: {exc}") from None
        if len(rows) != 1 or not isinstance(rows[0], dict) or rows[0].get("key") != key:
            raise ValueError(f"expected one row with key {key!r}, found {len(rows)} row(s)")
        return rows[0]

    def _set_aside(self, path, problem, quarantine):
        name = os.path.relpath(path, self.path)
        if quarantine:
            folder = os.path.join(self.path, "damaged")
            os.makedirs(folder, exist_ok=True)
            target = os.path.join(folder, f"{os.path.basename(path)}."
                                          f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
            try:
                os.replace(path, target)
            except FileNotFoundError:
                return
            action = f"moved to {os.path.relpath(target, self.path)}; the point will be computed again"
        else:
            action = "skipped (a sweep over it moves it aside and computes the point again)"
        warnings.warn(f"sweep store {self.path!r}: {name} cannot be read back ({problem}); "
                      f"{action}", RuntimeWarning, stacklevel=4)

    def rows(self, consolidate=True, quarantine=False) -> list:
        """All stored rows as dicts (from the cache where it is current).

        A point file that cannot be read back is skipped with a
        ``RuntimeWarning``; with ``quarantine=True`` (what a sweep does) it is
        also moved to ``damaged/``, so the point counts as missing and is
        computed again.
        """
        import pyarrow as pa
        import pyarrow.parquet as pq

        cache_path = os.path.join(self.path, "table.parquet")
        cached = {}
        if os.path.exists(cache_path):
            try:
                with open_regular(cache_path, "table.parquet") as fh:
                    for r in pq.read_table(fh, use_threads=False).to_pylist():
                        cached[r["key"]] = r
            except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
                cached = {}       # a damaged cache is rebuilt from the point files
        out, fresh = [], 0
        for path in sorted(glob.glob(os.path.join(self.path, "points", "*.parquet"))):
            key = os.path.basename(path)[:-8]
            # the cache row counts only for the exact bytes it was made from: a digest, not
            # a modification time (which a copy, an edit within the clock's tick or
            # `touch -r` keeps); hashing a point file costs far less than parsing it
            try:
                data, digest = self._point_bytes(path)
            except FileNotFoundError:
                continue
            except (OSError, ValueError) as exc:
                self._set_aside(path, exc, quarantine)
                continue
            c = cached.get(key)
            if c is not None and c.get(_DIGEST) == digest:
                out.append(c)
                continue
            try:
                r = self._read_point(path, key, data)
            except ValueError as exc:
                self._set_aside(path, exc, quarantine)
                continue
            r[_DIGEST] = digest
            out.append(r)
            fresh += 1
        if consolidate and fresh >= _CONSOLIDATE_AFTER:
            # every row gets every column: from_pylist takes its columns from the first row
            columns = list(dict.fromkeys(k for r in out for k in r))
            try:
                table = pa.Table.from_pylist([{k: r.get(k) for k in columns} for r in out])
                with atomic_file(cache_path) as fh:
                    pq.write_table(table, fh)
            except (OSError, pa.ArrowException):
                pass      # e.g. a column mixing types: the cache is an optimisation only
        return out

    def dataframe(self, param_names=None):
        """The stored rows as a DataFrame (columns: parameters, results, then bookkeeping)."""
        import pandas as pd

        rows = self.rows()
        for r in rows:
            r.pop(_DIGEST, None)
        df = pd.DataFrame.from_records(rows)
        if df.empty:
            return df
        meta = [c for c in META_COLUMNS if c in df.columns]
        params = [c for c in (param_names or []) if c in df.columns]
        rest = [c for c in df.columns if c not in meta and c not in params]
        return df[params + rest + meta]


def load_sweep(store):
    """Read a sweep store back as a DataFrame (one row per stored point).

    Same columns as :func:`symquad.sweep` returns: parameters, results,
    ``status`` ("ok"/"error"), ``error``, ``seconds``, ``finished_utc``,
    ``key``, ``task``, ``task_version`` (and ``arrays`` where a task stored
    arrays, read with :func:`load_sweep_arrays`).  Rows of every task version in the
    store are returned; filter on ``task_version`` if the task changed.
    """
    st = SweepStore(store)
    names = st.meta.get("params") or []
    df = st.dataframe(names)
    front = [c for c in names if c in df.columns]
    if front:
        try:        # rows ordered by parameters (mixed-type columns keep the key order)
            df = df.sort_values(front, kind="stable", ignore_index=True)
        except TypeError:
            pass
    return df


def load_sweep_arrays(store, key) -> dict:
    """The arrays stored with point `key` (a row's ``key``), as a dict of numpy arrays."""
    st = SweepStore(store)
    path = st.arrays_path(key)
    if not os.path.exists(path):
        raise KeyError(f"no arrays stored for point {key!r} in {st.path!r}")
    arrays, _ = read_npz(path, f"arrays of point {key!r} ({path!r})")
    return arrays


def new_token():
    """A short unique token (distinguishes Dask keys of repeated submissions)."""
    return uuid.uuid4().hex[:8]
