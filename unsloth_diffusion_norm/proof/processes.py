"""Processes the proof starts (launched ranks, the bench's memory process), stopped and reaped whole.

A launcher such as torchrun puts each rank in a session of its own, so neither a Ctrl-C at the terminal
nor a kill of the launcher reaches the ranks: killed alone, the launcher leaves them running for ever.
Every process started here carries a marker in its environment, which its descendants inherit whatever
session they move to and whoever becomes their parent; stopping a launch freezes every process that
carries the marker or descends from the launcher (a stopped process starts nothing), kills them all and
waits until none is left. Cleanup runs with Ctrl-C deferred, so a second press cannot cut it short.
"""

import contextlib
import os
import signal
import subprocess
import threading
import time
import uuid

MARKER = "UNSLOTH_DIFFUSION_NORM_PROCESS_GROUP"


class Interrupts:
    """SIGINT recorded instead of raised while cleanup runs (main thread only); raised afterwards if
    nothing else is being raised."""

    def __init__(self):
        self.pressed = False

    def __enter__(self):
        self.previous = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._record)
        return self

    def _record(self, *_):
        self.pressed = True

    def __exit__(self, exc_type, *_):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
        if self.pressed and exc_type is None:
            raise KeyboardInterrupt


def deferred_interrupts():
    return Interrupts()


def _alive(process):
    import psutil  # here, not at import: the command line loads this module where only the plugin is installed

    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def members(child, markers):
    """The live processes of a group: the child (a Popen) and its descendants while it runs, and whatever
    carries one of the markers (a reaped child's pid may belong to someone else by now)."""
    import psutil

    found = {}
    if child is not None and child.poll() is None:
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(child.pid)
            found = {p.pid: p for p in [root, *root.children(recursive=True)]}
    for process in psutil.process_iter():
        if process.pid in found or process.pid == os.getpid():
            continue
        with contextlib.suppress(psutil.Error):
            if process.environ().get(MARKER) in markers:
                found[process.pid] = process
    return [p for p in found.values() if _alive(p)]


def stop(child, marker, grace=30.0):
    """Freeze, kill and reap `child` (a Popen) and every process of its group, with Ctrl-C deferred
    meanwhile; returns the pids of any that outlived `grace` seconds (none should: SIGKILL cannot be
    refused)."""
    import psutil

    with deferred_interrupts():
        frozen = {}
        while True:  # until the group stops growing: a frozen process starts no other
            fresh = [p for p in members(child, {marker}) if p.pid not in frozen]
            if not fresh:
                break
            for process in fresh:
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.suspend()
                frozen[process.pid] = process
        for process in frozen.values():
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=grace)  # our own child: reaped here; the rest by their parents or init
        deadline = time.monotonic() + grace
        while (left := [p.pid for p in frozen.values() if _alive(p)]) and time.monotonic() < deadline:
            time.sleep(0.05)
        return left


def left_running():
    """Pids of processes that this process started here and that still run (what a command that was
    interrupted reports)."""
    return [p.pid for p in members(None, set(_STARTED))]


_STARTED = []  # the marker of every group started in this process


def start(command, marker=None, **popen):
    """Popen in a session of its own (a terminal's Ctrl-C reaches us, and we stop the group), marked so that
    every descendant can be found (`marker`: join a group already started). Returns (Popen, marker)."""
    if marker is None:
        marker = uuid.uuid4().hex
        _STARTED.append(marker)
    env = {**(popen.pop("env", None) or os.environ), MARKER: marker}
    return subprocess.Popen(command, env=env, start_new_session=True, **popen), marker


@contextlib.contextmanager
def group(command, **popen):
    """`start`, and the whole group stopped and reaped when the block leaves (normally, on an error, a
    timeout or Ctrl-C)."""
    child, marker = start(command, **popen)
    try:
        yield child
    finally:
        stop(child, marker)


def run(command, timeout, **popen):
    """subprocess.run(..., capture_output=True, text=True) for a command that starts processes of its own:
    done when the command itself exits (a rank it left behind holding its output does not keep us waiting),
    and then the whole group is stopped, also on a timeout or Ctrl-C. A timeout raises TimeoutError with
    the tail of what the command printed."""
    return run_together([command], timeout, **popen)


def run_together(commands, timeout, **popen):
    """`run` for commands that make one job side by side (the torchrun agents of several nodes), as one
    group: done when every command has exited, or as soon as one fails (the others are stopped with it).
    The return code is the first failure's, else 0; the output is every command's, in order."""
    import tempfile

    what = " & ".join(" ".join(command) for command in commands)[:300]
    with contextlib.ExitStack() as files:
        outputs = [
            (files.enter_context(tempfile.TemporaryFile("w+")), files.enter_context(tempfile.TemporaryFile("w+")))
            for _ in commands
        ]
        children, marker = [], None

        def stop_all():
            return [pid for child in children for pid in stop(child, marker)]

        try:
            for command, (out, err) in zip(commands, outputs):
                child, marker = start(command, marker, stdout=out, stderr=err, text=True, **popen)
                children.append(child)
            deadline = time.monotonic() + timeout
            while (codes := [child.poll() for child in children]).count(None) and not any(codes):
                if time.monotonic() > deadline:
                    left = stop_all()
                    stopped = f"processes {left} survived SIGKILL" if left else "every process it started is stopped"
                    printed = "\n".join(f"{_read(out)[-2000:]}\n{_read(err)[-4000:]}" for out, err in outputs)
                    raise TimeoutError(f"{what} ran past {timeout} s; {stopped}. Its output ended:\n{printed}")
                time.sleep(0.05)
        except BaseException:
            stop_all()
            raise
        left = stop_all()  # anything they left running (and, after a failure, the others)
        if left:
            raise RuntimeError(f"{what}: processes {left} survived SIGKILL")
        code = next((code for code in codes if code), 0)
        return subprocess.CompletedProcess(
            commands if len(commands) > 1 else commands[0],
            code,
            "".join(_read(out) for out, _ in outputs),
            "".join(_read(err) for _, err in outputs),
        )


def _read(file):
    file.seek(0)
    return file.read()
