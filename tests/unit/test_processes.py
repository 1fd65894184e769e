"""The proof's launched processes are stopped whole: a launcher's ranks sit in sessions of their own (as
torchrun puts them), so killing the launcher alone leaves them running. Real processes, no Unsloth."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from unsloth_diffusion_norm.proof import processes

# A launcher in miniature: starts a "rank" in a session of its own that writes its pid and hangs, then hangs
# itself (or, with --leave, exits once the rank is up and leaves it running, parented to init).
LAUNCHER = textwrap.dedent("""
    import os, subprocess, sys, time
    rank = "import os, sys, time; open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid())); "
    rank += "os.rename(sys.argv[1] + '.tmp', sys.argv[1]); time.sleep(3600)"
    subprocess.Popen([sys.executable, "-c", rank, sys.argv[1]], start_new_session=True)
    if "--leave" in sys.argv:
        while not os.path.exists(sys.argv[1]):
            time.sleep(0.01)
    else:
        time.sleep(3600)
""")


def rank_pid(path, seconds=300):
    """The rank's pid, once it has written it (a generous ceiling: a busy machine starts Python slowly)."""
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise AssertionError("the rank never started")
        time.sleep(0.05)
    return int(open(path).read())


def running(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_hung_launch_times_out_and_leaves_no_rank_running(tmp_path):
    """The launch must be hung with its rank up when the timeout falls: on a machine too busy to start both within
    the timeout, the same launch runs again with a longer one (the event decides, not the clock)."""
    pid_file = str(tmp_path / "rank.pid")
    for timeout in (3, 15, 60, 240):
        with pytest.raises(TimeoutError, match=f"ran past {timeout} s; every process it started is stopped"):
            processes.run([sys.executable, "-c", LAUNCHER, pid_file], timeout=timeout)
        if os.path.exists(pid_file):
            break
    assert not running(rank_pid(pid_file, seconds=0))


def test_an_interrupted_launch_stops_its_ranks_in_their_own_sessions(tmp_path):
    pid_file = str(tmp_path / "rank.pid")
    with pytest.raises(KeyboardInterrupt):
        with processes.group([sys.executable, "-c", LAUNCHER, pid_file]) as child:
            pid = rank_pid(pid_file)
            assert psutil.Process(pid).ppid() == child.pid and os.getsid(pid) == pid  # a session of its own
            raise KeyboardInterrupt
    assert not running(pid) and child.returncode is not None  # our own child is reaped too
    assert processes.left_running() == []


def test_a_rank_its_launcher_left_behind_is_found_by_its_marker_and_stopped(tmp_path):
    pid_file = str(tmp_path / "rank.pid")
    done = processes.run([sys.executable, "-c", LAUNCHER, pid_file, "--leave"], timeout=300)
    assert done.returncode == 0
    assert not running(rank_pid(pid_file))


def test_a_second_ctrl_c_waits_until_the_cleanup_is_done():
    finished = []
    with pytest.raises(KeyboardInterrupt):
        with processes.deferred_interrupts():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)  # the signal is delivered here, and only recorded
            finished.append(True)
    assert finished == [True]
    with processes.deferred_interrupts():  # nothing pressed: nothing raised
        pass


def test_a_command_that_succeeds_is_an_ordinary_completed_process():
    done = processes.run([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr)"], timeout=300)
    assert (done.returncode, done.stdout, done.stderr) == (0, "out\n", "err\n")
    assert isinstance(done, subprocess.CompletedProcess)


# A proof process makes scratch folders, forks a child that makes its own and exits normally, then exits.
SCRATCH_USER = textwrap.dedent("""
    import os, sys
    from unsloth_diffusion_norm.proof import fixtures
    mine = fixtures.scratch("udn-run-")
    open(os.path.join(mine, "kept-until-exit"), "w").close()
    child = os.fork()
    if child == 0:
        fixtures.scratch("udn-resume-")  # the parent's scratch directory, already made: the child's exit spares it
        sys.exit(0)
    os.waitpid(child, 0)
    assert os.path.exists(os.path.join(mine, "kept-until-exit")), "a forked child's exit removed its parent's scratch"
    print(mine)
""")


def test_scratch_folders_are_removed_when_the_process_that_made_them_exits(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", SCRATCH_USER],
        env={**os.environ, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(str(tmp_path))
    assert os.listdir(tmp_path) == []
