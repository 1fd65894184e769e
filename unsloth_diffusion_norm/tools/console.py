"""What every command of the command line shares, each written once: the exit statuses and the one-line
Failure, the progress lines on stderr, JSON out (stdout or a file), the optional PNG plot, the scratch
directory a command's leftovers go to, and Unsloth's import."""

import argparse
import contextlib
import json
import math
import os
import shutil
import sys
import tempfile
import threading
import time

PROG = "unsloth-diffusion-norm"

# Exit statuses, every command (doctor's own words for 0-2: fixed, affected, not supported).
DONE = 0  # done; doctor, reproduce: the fix holds here
FAILED = 1  # doctor, reproduce: this stack is affected and not fixed, or the check failed (or could not run)
USAGE = 2  # a bad command line, a --model DIR the self-check cannot run on, input impact cannot use
UNSUPPORTED = 2  # an Unsloth release the plugin does not support
NO_UNSLOTH = 3  # Unsloth is not installed or cannot be imported
UNWRITABLE = 4  # an output file could not be written
INTERRUPTED = 130  # Ctrl-C

INSTALL = "pip install 'unsloth>=2026.10.4'"
PLOT_HINT = "pip install 'unsloth-diffusion-norm[bench]'"  # matplotlib is an optional extra


class Failure(Exception):
    """One line for stderr, and the exit status that goes with it."""

    code = FAILED

    def __init__(self, line, code=None):
        super().__init__(line)
        if code is not None:
            self.code = code


class Progress:
    """Lines on stderr a person can follow, `label [  12 s] what`: `say` for each new phase or run, and while
    one lasts longer than `every` seconds a line saying it is still going, so the output is never silent
    for long. `quiet_for`: nothing before the run has lasted that long (a quick refusal stays one line)."""

    def __init__(self, label, write=None, every=10.0, quiet_for=0.0):
        self.label, self.every, self.quiet_for = label, every, quiet_for
        self.write = write or (lambda line: print(line, file=sys.stderr, flush=True))
        self.started = self.last = time.monotonic()
        self.doing = "starting"
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, daemon=True)

    def __enter__(self):
        self._beat.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._beat.join()

    def say(self, doing):
        self.doing = doing
        self._emit(doing)

    def _emit(self, text):
        now = time.monotonic()
        if now - self.started < self.quiet_for:
            return
        self.last = now
        self.write(f"{self.label} [{now - self.started:4.0f} s] {text}")

    def _heartbeat(self):
        while not self._stop.wait(1.0):
            if time.monotonic() - self.last >= self.every:
                self._emit(f"{self.doing} - still running")


def finite(value):
    """JSON without NaN / Infinity (not JSON), whatever a broken self-check measured."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def print_json(value):
    print(json.dumps(finite(value), indent=1))


def write_json(value, path):
    """`value` as JSON in the file `path`; Failure(UNWRITABLE) naming the file when it cannot be written."""
    try:
        with open(path, "w") as f:
            json.dump(finite(value), f, indent=1)
    except OSError as error:
        raise Failure(f"cannot write {path!r}: {error.strerror}", UNWRITABLE) from None


def positive_int(text):
    """An argparse type: a whole number of at least 1 (the commands' and the study's counts)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, not {text!r}")
    return value


def writable(text):
    """A file path this process can write, checked before any long run starts ('' passes: no file)."""
    if text:
        existed = os.path.exists(text)
        try:
            with open(text, "a"):
                pass
        except OSError as error:
            raise argparse.ArgumentTypeError(f"cannot write {text!r}: {error.strerror}") from None
        if not existed:
            os.remove(text)
    return text


def can_plot():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


NO_PLOT = f"matplotlib is not installed ({PLOT_HINT} adds it)"  # what every command says without it


def pyplot():
    """matplotlib.pyplot drawing to files (no screen); None without matplotlib (say NO_PLOT then)."""
    if not can_plot():
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@contextlib.contextmanager
def scratch_space():
    """One temporary directory, removed at exit (Ctrl-C included), for everything this process and the
    processes it starts write that nobody asked for: our checkpoints and run folders (tempfile), torch's
    caches (TMPDIR), Unsloth's compiled cache (UNSLOTH_COMPILE_LOCATION, read when Unsloth is imported;
    by default it lands in the current directory) and the tiny model's copied remote code
    (HF_MODULES_CACHE). Only this process sees these settings; a user's own training keeps Unsloth's."""
    root = tempfile.mkdtemp(prefix="udn-cli-")
    SCRATCH.append(root)
    settings = {"TMPDIR": root}
    if not {"unsloth", "transformers"} & sys.modules.keys():  # both read these once, when imported
        for name, leaf in (("UNSLOTH_COMPILE_LOCATION", "unsloth_compiled_cache"), ("HF_MODULES_CACHE", "hf_modules")):
            if name not in os.environ:  # a location the user chose stays theirs
                settings[name] = os.path.join(root, leaf)
    saved = {name: os.environ.get(name) for name in settings}
    saved_tempdir = tempfile.tempdir
    os.environ.update(settings)
    tempfile.tempdir = root
    try:
        yield root
    finally:
        from ..proof.processes import deferred_interrupts

        with deferred_interrupts():  # a second Ctrl-C must not cut the removal short
            tempfile.tempdir = saved_tempdir
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            shutil.rmtree(root, ignore_errors=True)


SCRATCH = []  # every scratch directory this process made: what an interrupted command reports on


def installed_unsloth():
    """Unsloth's version ('' when it is importable without package metadata); Failure(NO_UNSLOTH) if absent."""
    from importlib import metadata, util

    try:
        return metadata.version("unsloth")
    except metadata.PackageNotFoundError:
        if "unsloth" in sys.modules or util.find_spec("unsloth") is not None:
            return ""
    raise Failure(f"Unsloth is not installed; install it with: {INSTALL}", NO_UNSLOTH)


def import_unsloth():
    """Import Unsloth after the plugin, as users do, with its banners on stderr so that stdout carries only
    our report. Raises Failure(NO_UNSLOTH) naming what is wrong and what to do."""
    version = installed_unsloth()
    if "unsloth" in sys.modules:
        return
    from ..proof import fixtures

    try:
        fixtures.import_unsloth(banners=sys.stderr)
    except Exception as error:  # noqa: BLE001 - whatever breaks the import, the user gets one line
        detail = " ".join(str(error).split())
        raise Failure(
            f"Unsloth {version} is installed but `import unsloth` fails: {type(error).__name__}: {detail}", NO_UNSLOTH
        ) from None


def refuse_unsupported():
    from ..activation import status
    from ..registry import UNSUPPORTED as UNSUPPORTED_MODE

    state = status()
    if state.mode == UNSUPPORTED_MODE:
        raise Failure(f"Unsloth {state.unsloth_version} is not supported: {state.reason}", UNSUPPORTED)
