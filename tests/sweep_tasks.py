"""Small user tasks for tests/test_sweep.py (a module, so Dask workers can import them)."""

import os
import signal
import time


def square(x, delay=0.0, log=""):
    """y = x², after sleeping `delay` s; appends a line to the file `log` per call."""
    if log:
        with open(log, "a") as fh:
            fh.write(f"{x}\n")
    time.sleep(delay)
    return {"y": x * x}


def gated(x, gate, open_below=3, wait=300.0):
    """y = x²; a point with x >= `open_below` first waits for the file `gate` (at most `wait` s).

    Holds a sweep at a known point (the first `open_below` points done, the others
    in flight) for as long as a test needs, without racing a clock.
    """
    if x >= open_below:
        end = time.monotonic() + wait
        while not os.path.exists(gate):
            if time.monotonic() > end:
                raise TimeoutError(f"the gate {gate} was not opened within {wait} s")
            time.sleep(0.02)
    return {"y": x * x}


def fails_on_odd(x):
    """Raises ValueError for odd x."""
    if x % 2:
        raise ValueError(f"odd x={x} rejected")
    return {"y": x * x}


def bad_result(x):
    """Returns a non-flat result (a dict inside): must become an error row."""
    return {"y": {"nested": x}}


def kill_worker_once(x, marker_dir, delay=0.2):
    """The first execution with x == 0 SIGKILLs its own (worker) process."""
    time.sleep(delay)
    marker = os.path.join(marker_dir, f"killed-{x}")
    if x == 0 and not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return {"y": x * x, "pid": os.getpid()}


def mostly_fails(x):
    """Raises for x not a multiple of 10 (error rows without result columns)."""
    if x % 10:
        raise ValueError(f"x={x}")
    return {"y": x * x, "label": f"x{x}"}


def calls_exit(x):
    """Calls sys.exit(3) for x == 1 (must be an error row, not the exit of the process)."""
    import sys
    if x == 1:
        sys.exit(3)
    return {"y": x * x}
def sleepy(x, duration=60.0, pidfile=""):
    """Sleeps `duration` s (writes its pid to `pidfile` first): stands for a point that hangs."""
    if pidfile:
        with open(pidfile, "w") as fh:
            fh.write(str(os.getpid()))
    time.sleep(duration)
    return {"y": x}


def spin(x, duration=60.0):
    """Busy loop (numpy calls) for `duration` seconds."""
    import numpy as np
    end = time.monotonic() + duration
    a = np.ones(1000)
    while time.monotonic() < end:
        a = np.sqrt(a * a + 1.0) - 0.5
    return {"y": x}


def unstorable(x, kind="object"):
    """Returns a result the store cannot read back (`kind`), or a fine one for kind="ok"."""
    import numpy as np
    if kind == "object":
        return {"y": np.array([{"a": 1}, None], dtype=object)}
    if kind == "bigint":
        return {"y": 2 ** 70}
    if kind == "uint64":
        return {"y": np.uint64(2 ** 64 - 1)}
    if kind == "surrogate":
        return {"y": "\ud800"}
    if kind == "longdouble":
        return {"y": np.longdouble(1.5)}
    return {"y": x, "arr": np.arange(3.0)}


def exits_hard(x):
    """Ends its own process without unwinding (os._exit)."""
    os._exit(7)


def terminates_once(x, marker_dir=""):
    """At x == 1, the first time (no marker file yet), sends SIGTERM to its own process:
    stands for a batch scheduler stopping a serial sweep while that point is in flight."""
    marker = os.path.join(marker_dir, "terminated")
    if x == 1 and not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)          # the handler raises before this ends
    return {"y": x * x}
