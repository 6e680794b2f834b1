r"""A resumable, crash-safe store of sweep results: one Parquet file per point.

Layout of a store folder::

    STORE/store.json              format version and the task's name (written once)
    STORE/points/<key>.parquet    one row per finished point (written atomically)
    STORE/arrays/<key>.npz        the point's arrays, if the task returned any
    STORE/table.parquet           consolidated cache of the rows (rebuildable)

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
instead of adding one.  ``table.parquet`` is only a cache: rows are read from
it when the point file has the modification time recorded in the cache, and
from the point file otherwise, so a stale or missing cache never loses or
duplicates a row.

Only the process that drives a sweep writes (workers return their results to
it), so a store needs no shared file system when the workers run elsewhere.
"""

from __future__ import annotations

import glob
import hashlib
import json
import math
import os
import socket
import uuid
from numbers import Integral, Real

import numpy as np

from .._atomic import atomic_file

__all__ = ["SweepStore", "point_key", "canonical_params", "load_sweep", "load_sweep_arrays",
           "META_COLUMNS"]

FORMAT = 1
#: columns the engine adds to every row (a task's results may not use these names)
META_COLUMNS = ("status", "error", "seconds", "finished_utc", "key", "task", "task_version",
                "arrays", "traceback")
_CONSOLIDATE_AFTER = 64       # rebuild the cache once this many rows are read from points/


def _canonical(value, name):
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, Integral):
        return int(value)
    if isinstance(value, Real):
        v = float(value)
        if not math.isfinite(v):
            raise ValueError(f"parameter {name!r} must be finite, got {value!r}")
        return v
    if isinstance(value, str):
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


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
        if task is None and not os.path.exists(meta_path):
            raise FileNotFoundError(f"{self.path!r} is not a sweep store (no store.json)")
        os.makedirs(os.path.join(self.path, "points"), exist_ok=True)
        os.makedirs(os.path.join(self.path, "arrays"), exist_ok=True)
        if os.path.exists(meta_path):
            with open(meta_path, encoding="utf-8") as fh:
                self.meta = json.load(fh)
            if self.meta.get("format") != FORMAT:
                raise ValueError(f"store {self.path!r} has format {self.meta.get('format')}, "
                                 f"this symquad reads format {FORMAT}")
            if task is not None and self.meta["task"] != task:
                raise ValueError(f"store {self.path!r} holds task {self.meta['task']!r}, not "
                                 f"{task!r}; use another folder")
        else:
            self.meta = {"format": FORMAT, "task": task}
            self._write_meta()

    def __repr__(self):
        return f"SweepStore({self.path!r}, task={self.meta['task']!r})"

    def _write_meta(self):
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
        """Delete ``.tmp-*`` files left by dead processes of this host."""
        host = socket.gethostname()
        for sub in ("points", "arrays", "."):
            for tmp in glob.glob(os.path.join(self.path, sub, ".tmp-*")):
                parts = os.path.basename(tmp)[5:].split("-")
                try:
                    pid = int(parts[-2])
                except (ValueError, IndexError):
                    continue
                if "-".join(parts[:-2]) == host and not _pid_alive(pid):
                    try:
                        os.unlink(tmp)
                    except FileNotFoundError:
                        pass

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
    def rows(self, consolidate=True) -> list:
        """All stored rows as dicts (from the cache where it is current)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        cache_path = os.path.join(self.path, "table.parquet")
        cached = {}
        if os.path.exists(cache_path):
            try:
                for r in pq.read_table(cache_path).to_pylist():
                    cached[r["key"]] = r
            except (OSError, pa.ArrowException):
                cached = {}       # a damaged cache is rebuilt from the point files
        out, fresh = [], 0
        for path in sorted(glob.glob(os.path.join(self.path, "points", "*.parquet"))):
            key = os.path.basename(path)[:-8]
            try:
                mtime = os.stat(path).st_mtime_ns
            except FileNotFoundError:
                continue
            c = cached.get(key)
            if c is not None and c.get("_mtime_ns") == mtime:
                out.append(c)
                continue
            r = pq.read_table(path).to_pylist()[0]
            r["_mtime_ns"] = mtime
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
            r.pop("_mtime_ns", None)
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
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def new_token():
    """A short unique token (distinguishes Dask keys of repeated submissions)."""
    return uuid.uuid4().hex[:8]
