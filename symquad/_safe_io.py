"""Reading files that someone else may have put there: bounded, non-blocking, no pickle.

Every file symquad reads back -- cache kernels, report folders, sweep stores,
``--data`` trajectories, saved results -- goes through these functions, so the
same three guarantees hold everywhere:

* **No blocking open.**  A path is opened with ``O_NONBLOCK`` and checked with
  ``fstat`` to be a regular file *before* anything is read, so a FIFO or a
  device in place of a file is refused at once (a plain :func:`open` of a FIFO
  waits forever for a writer; ``/dev/zero`` never ends).
* **Sizes checked before allocating.**  A file is read only when its size is
  within the caller's limit.  For ``.npz`` archives (:func:`read_npz`) the zip
  directory is read first: the number of members, every member's declared
  uncompressed size and every ``.npy`` header (dtype, shape) are checked, and
  a header must describe exactly the bytes its member holds, before a single
  array is allocated -- so a zip bomb, a lying header or an archive of
  millions of members is refused in constant memory.  (The zip reader never
  returns more bytes than a member declares, so the declared size bounds
  what is decompressed.)
* **No code.**  Arrays are read with ``allow_pickle=False``; object dtypes are
  refused from their header.
"""

from __future__ import annotations

import errno
import math
import os
import stat
import struct
import zipfile

__all__ = ["open_regular", "read_regular", "read_npz", "read_npy", "available_memory", "MAX_READ_BYTES"]

#: Default cap on the bytes one call may load (also limited by the free memory).
MAX_READ_BYTES = 8 * 2**30
#: Most members an archive may list (symquad's own files have a few dozen).
MAX_MEMBERS = 4096
#: Largest ``.npy`` header accepted (numpy's own default limit).
_MAX_HEADER = 10_000


def available_memory():
    """Bytes of memory available to new allocations (``MemAvailable``), or None if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _limit(max_bytes):
    """`max_bytes` (default :data:`MAX_READ_BYTES`), lowered to the available memory."""
    limit = MAX_READ_BYTES if max_bytes is None else int(max_bytes)
    free = available_memory()
    return limit if free is None else min(limit, free)


def _size(n):
    return f"{n / 2**30:.3g} GiB" if n >= 2**30 else f"{n / 2**20:.3g} MiB" \
        if n >= 2**20 else f"{n} bytes"


def open_regular(path, what="file", max_bytes=None):
    """Open `path` for binary reading only if it is a regular file of at most `max_bytes`.

    Raises
    ------
    FileNotFoundError
        Nothing there.
    ValueError
        A folder, FIFO, socket or device (refused without blocking), or a file
        larger than the limit.
    OSError
        Any other failure to open (permissions, ...).
    """
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
                     | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_BINARY", 0))
    except IsADirectoryError:
        raise ValueError(f"{what} {path!r} is a folder, not a file") from None
    except OSError as exc:
        if exc.errno == errno.ENXIO:       # a FIFO with no writer, opened non-blocking
            raise ValueError(f"{what} {path!r} is not a regular file (a FIFO or socket)") \
                from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = ("a folder" if stat.S_ISDIR(info.st_mode) else
                    "a FIFO" if stat.S_ISFIFO(info.st_mode) else
                    "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode)
                    else "a socket" if stat.S_ISSOCK(info.st_mode) else "not a file")
            raise ValueError(f"{what} {path!r} is not a regular file ({kind}); refused "
                             f"without reading it")
        limit = MAX_READ_BYTES if max_bytes is None else int(max_bytes)
        if info.st_size > limit:
            raise ValueError(f"{what} {path!r} has {_size(info.st_size)}, more than the "
                             f"{_size(limit)} accepted")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)          # a regular file: ordinary reads from here on
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path, what="file", max_bytes=64 * 2**20) -> bytes:
    """The bytes of a regular file of at most `max_bytes` (see :func:`open_regular`)."""
    with open_regular(path, what, max_bytes) as fh:
        data = fh.read(int(max_bytes) + 1)
    if len(data) > max_bytes:       # grew while we read it
        raise ValueError(f"{what} {os.fspath(path)!r} is larger than {_size(max_bytes)}")
    return data


# ---------------------------------------------------------------------------
# .npz archives
# ---------------------------------------------------------------------------
def _zip_member_count(fh, size, what):
    """Members listed by the end-of-central-directory record (zip64 included), or None."""
    tail = min(size, 22 + 65535)
    fh.seek(size - tail)
    data = fh.read(tail)
    at = data.rfind(b"PK\x05\x06")
    if at < 0 or at + 22 > len(data):
        return None
    count = struct.unpack("<H", data[at + 10:at + 12])[0]
    if count == 0xFFFF and at >= 20 and data[at - 20:at - 16] == b"PK\x06\x07":
        offset = struct.unpack("<Q", data[at - 12:at - 4])[0]
        if offset + 56 <= size:
            fh.seek(offset)
            rec = fh.read(56)
            if rec[:4] == b"PK\x06\x06":
                count = struct.unpack("<Q", rec[32:40])[0]
    return count


def _npy_header(stream, name, what):
    """``(dtype, shape, fortran, header_bytes)`` of the .npy member `stream` (nothing else read)."""
    import numpy as np

    fmt = np.lib.format
    try:
        version = fmt.read_magic(stream)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(stream, max_header_size=_MAX_HEADER)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = fmt.read_array_header_2_0(stream, max_header_size=_MAX_HEADER)
        else:
            raise ValueError(f"unknown .npy version {version}")
    except (ValueError, OSError, EOFError, SyntaxError) as exc:
        raise ValueError(f"{what}: member {name!r} is not a valid .npy array ({exc})") from None
    return dtype, shape, fortran, stream.tell()


def read_npz(path, what="file", *, keys=None, extras=(), max_bytes=None,
             max_extra_bytes=16 * 2**20, check=None):
    """Arrays of an ``.npz`` archive, every size checked before anything is allocated.

    Parameters
    ----------
    path : path-like
        The archive (a regular file; see :func:`open_regular`).
    what : str
        How errors name the file (e.g. ``"--data 'run.npz'"``).
    keys : collection of str, optional
        Array names allowed (``NAME.npy`` members); any other member is
        refused.  Default: any ``.npy`` member.
    extras : collection of str
        Non-array members that are returned as bytes (e.g. ``"meta.json"``),
        each at most `max_extra_bytes`.
    max_bytes : int, optional
        Cap on the total bytes loaded (default :data:`MAX_READ_BYTES`, lowered
        to the free memory).
    check : callable, optional
        ``check(headers, extras)`` with ``headers = {key: (dtype, shape)}`` and
        the `extras` read so far (``name -> bytes``; they are small and read
        first) runs after the headers are read and before any array is: raise
        ValueError to refuse the file from its declared shapes (a saved run
        checks its shapes against the model its ``meta.json`` names).

    Returns
    -------
    (arrays, extras) : (dict, dict)
        ``key -> ndarray`` and ``member name -> bytes``.

    Raises
    ------
    ValueError
        Not a zip archive, a member that is neither an allowed array nor an
        extra, an object dtype, a header that disagrees with its member's
        size, or sizes beyond the limits -- all before any array is read.
    """
    import numpy as np

    limit = _limit(max_bytes)
    extras = set(extras)
    with open_regular(path, what) as fh:
        size = os.fstat(fh.fileno()).st_size
        head = fh.read(4)
        if head.startswith(b"\x93NUMPY"[:4]):
            raise ValueError(f"{what} is a single .npy array, not an .npz archive")
        count = _zip_member_count(fh, size, what)
        if count is None or head != b"PK\x03\x04" and count:
            raise ValueError(f"{what} is not an .npz (zip) archive")
        if count > MAX_MEMBERS:
            raise ValueError(f"{what} lists {count} members, more than the {MAX_MEMBERS} "
                             f"accepted")
        fh.seek(0)
        try:
            zf = zipfile.ZipFile(fh)
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
            raise ValueError(f"{what} is not a readable .npz archive ({exc})") from None
        with zf:
            infos = zf.infolist()
            if len(infos) > MAX_MEMBERS:
                raise ValueError(f"{what} lists {len(infos)} members, more than "
                                 f"{MAX_MEMBERS}")
            total = 0
            plan, other = [], []
            unexpected = sorted(i.filename[:-4] for i in infos if i.filename.endswith(".npy")
                                and keys is not None and i.filename[:-4] not in keys
                                and i.filename not in extras)
            if unexpected:
                raise ValueError(f"{what} holds unexpected array(s) {unexpected}; allowed "
                                 f"keys: {', '.join(sorted(keys))}")
            for info in infos:
                name = info.filename
                if info.flag_bits & 0x1:
                    raise ValueError(f"{what}: member {name!r} is encrypted")
                total += info.file_size
                if total > limit:
                    raise ValueError(
                        f"{what} declares {_size(total)} of uncompressed data (member "
                        f"{name!r}: {_size(info.file_size)} from {_size(info.compress_size)} "
                        f"stored), more than the {_size(limit)} accepted (limit or free "
                        f"memory); refused before reading it")
                if name in extras:
                    if info.file_size > max_extra_bytes:
                        raise ValueError(f"{what}: member {name!r} has {_size(info.file_size)}"
                                         f", more than {_size(max_extra_bytes)}")
                    other.append(info)
                    continue
                key = name[:-4] if name.endswith(".npy") else None
                if key is None:
                    raise ValueError(f"{what} holds a member {name!r} that is not an array "
                                     f"(NAME.npy)" + (f" nor one of {sorted(extras)}"
                                                      if extras else ""))
                plan.append((key, info))
            headers = {}
            for key, info in plan:
                try:
                    with zf.open(info) as stream:
                        dtype, shape, fortran, hlen = _npy_header(stream, info.filename, what)
                except (zipfile.BadZipFile, OSError, EOFError,
                        NotImplementedError, RuntimeError) as exc:
                    raise ValueError(f"{what}: member {info.filename!r} cannot be read "
                                     f"({exc})") from None
                if dtype.hasobject:
                    raise ValueError(f"{what}: array {key!r} holds Python objects (dtype "
                                     f"{dtype}); only numeric arrays are read, never unpickled")
                nbytes = math.prod(shape) * dtype.itemsize
                if hlen + nbytes != info.file_size:
                    raise ValueError(
                        f"{what}: array {key!r} declares shape {shape} of {dtype} "
                        f"({_size(nbytes)}) but its member holds "
                        f"{_size(info.file_size - hlen)} of data; refused before reading")
                headers[key] = (dtype, tuple(shape))
            blobs = {}
            for info in other:
                try:
                    blobs[info.filename] = zf.read(info)
                except (zipfile.BadZipFile, OSError, EOFError) as exc:
                    raise ValueError(f"{what}: member {info.filename!r} cannot be read "
                                     f"({exc})") from None
            if check is not None:
                check(dict(headers), dict(blobs))
            arrays = {}
            for key, info in plan:
                try:
                    with zf.open(info) as stream:
                        arrays[key] = np.lib.format.read_array(stream, allow_pickle=False)
                except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
                    raise ValueError(f"{what}: array {key!r} cannot be read ({exc})") from None
    return arrays, blobs


# ---------------------------------------------------------------------------
# single .npy files
# ---------------------------------------------------------------------------
def read_npy(path, what="file", *, max_bytes=None, check=None):
    """The array of a single ``.npy`` file, its header checked before the data is read.

    Parameters
    ----------
    path : path-like
        A regular file (see :func:`open_regular`).
    what : str
        How errors name the file.
    max_bytes : int, optional
        Cap on the array's bytes (default :data:`MAX_READ_BYTES`, lowered to
        the free memory).
    check : callable, optional
        ``check(dtype, shape)`` runs on the header before any data is read;
        raise ValueError/TypeError to refuse the file.

    Raises
    ------
    ValueError
        Not a ``.npy`` file, an object dtype, a file whose size is not what its
        header declares, or an array beyond the limit -- before reading data.
    """
    import numpy as np

    limit = _limit(max_bytes)
    with open_regular(path, what) as fh:
        size = os.fstat(fh.fileno()).st_size
        if fh.read(6) != b"\x93NUMPY":
            raise ValueError(f"{what} is not a .npy file")
        fh.seek(0)
        dtype, shape, _, hlen = _npy_header(fh, "the array", what)
        if dtype.hasobject:
            raise ValueError(f"{what} holds Python objects (dtype {dtype}); only numeric "
                             f"arrays are read, never unpickled")
        if check is not None:
            check(dtype, tuple(shape))
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > limit:
            raise ValueError(f"{what} declares {_size(nbytes)} of data, more than the "
                             f"{_size(limit)} accepted (limit or free memory)")
        if hlen + nbytes != size:
            raise ValueError(f"{what}: the file has {size} bytes, not what its header "
                             f"declares ({hlen} + {nbytes}; a damaged or forged file)")
        fh.seek(0)
        return np.lib.format.read_array(fh, allow_pickle=False)

