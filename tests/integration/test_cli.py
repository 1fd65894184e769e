"""The command line as a new user meets it: real runs of `python -m unsloth_diffusion_norm` in their own
processes (real Unsloth on CPU). A bad input or a missing piece gets one line on stderr and its documented
exit status, never a traceback; stdout carries only the report; nothing is left in the working directory or
the temporary directory; `bench --quick` is a labelled smoke run that shows its progress."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import psutil
import pytest

import unsloth_diffusion_norm

PROG = "unsloth-diffusion-norm"
CLI = [sys.executable, "-m", "unsloth_diffusion_norm"]
# This checkout's package, for an environment that has nothing else installed.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(unsloth_diffusion_norm.__file__)))
INSTALL = "pip install 'unsloth>=2026.10.4'"


def blocked(module):
    """The CLI in a process where `import <module>` fails, as it does where the module is missing."""
    code = f"import sys; sys.modules[{module!r}] = None; from unsloth_diffusion_norm.tools.cli import main; sys.exit(main())"
    return [sys.executable, "-c", code]


def run(args, places, command=CLI, env=None, timeout=180):
    cwd, tmp = places
    env = {**os.environ, "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([*command, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def places(tmp_path):
    """A fresh working directory and a fresh temporary directory (TMPDIR) for one command."""
    cwd, tmp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir()
    tmp.mkdir()
    return cwd, tmp


def left_behind(places):
    return {str(where): os.listdir(where) for where in places if os.listdir(where)}


def only_line(done, code):
    """A failure: exactly one line on stderr, no traceback, nothing on stdout, the documented status."""
    assert done.returncode == code, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(PROG), done.stderr[-3000:]
    assert done.stdout == ""
    return lines[0]


# --- the command line itself (no Unsloth import: fractions of a second) ---


def test_version_and_python_m_are_the_cli(places):
    done = run(["--version"], places)
    assert done.returncode == 0 and done.stdout.startswith(f"{PROG} {unsloth_diffusion_norm.__version__} (Unsloth ")
    script = os.path.join(os.path.dirname(sys.executable), PROG)
    if os.path.exists(script):  # the console script, where pip installed it
        assert run(["--version"], places, command=[script]).stdout == done.stdout
    assert "the following arguments are required: command" in only_line(run([], places), 2)


@pytest.mark.parametrize(
    "args, names",
    [
        (["bench", "--blocks", "0"], "--blocks"),
        (["bench", "--steps", "0"], "--steps"),
        (["bench", "--steps", "two"], "--steps"),
        (["reproduce", "--seed", "-1"], "--seed"),
        (["reproduce", "--seed", str(2**32)], "--seed"),
        (["bench", "--json", "/nonexistent/bench.json"], "cannot write '/nonexistent/bench.json'"),
        (["bench", "--plot", "/dev/null/bench.png"], "cannot write '/dev/null/bench.png'"),
        (["bench", "--quick", "--models", "larger"], "--quick"),
        (["doctor", "--bogus"], "--bogus"),
    ],
)
def test_a_bad_command_line_is_one_line_and_exit_2_before_anything_runs(args, names, places):
    # timeout: before the checks these ran the whole bench (minutes) and then failed with a traceback
    assert names in only_line(run(args, places, timeout=60), 2)
    assert left_behind(places) == {}


@pytest.mark.parametrize(
    "text, names",
    [
        ("diffusion_t_sampler: sobol\n", "diffusion_t_sampler must be 'stratified' or None (the default), got 'sobol'"),
        ("diffusion_t_sampler: stratified\n", "set diffusion_noise='per_sample'"),
        ("diffusion_complementary_masks: maybe\n", "diffusion_complementary_masks must be True or False"),
        ("- a list\n", "is not a mapping of settings"),
        ("gradient_accumulation_steps: 0\n", "gradient_accumulation_steps must be a whole number of at least 1, not 0"),
    ],
)
def test_a_config_doctor_refuses_is_one_line_and_exit_2_before_unsloth_loads(text, names, places):
    (places[0] / "train.yaml").write_text("learning_rate: 1.0e-5\n" + text if text[0] != "-" else text)
    line = only_line(run(["doctor", "--config", "train.yaml"], places, timeout=60), 2)
    assert line.startswith(f"{PROG} doctor: ") and names in line
    (places[0] / "train.yaml").unlink()
    assert left_behind(places) == {}


def test_doctor_json_is_json_even_for_a_bad_command_line(places):
    done = run(["doctor", "--json", "--bogus"], places, timeout=60)
    assert done.returncode == 2 and json.loads(done.stdout)["exit"] == 2 and "--bogus" in done.stderr


# --- Unsloth missing or broken ---


@pytest.fixture(scope="module")
def without_unsloth(tmp_path_factory):
    """A plain virtual environment holding only this plugin (on its path): no Unsloth, no torch."""
    where = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = str(where / "bin" / "python")
    if subprocess.run([python, "-c", "import unsloth"], capture_output=True).returncode == 0:
        pytest.skip("this interpreter has Unsloth installed system-wide")
    return SimpleNamespace(
        command=[python, "-m", "unsloth_diffusion_norm"], python=python, env={"PYTHONPATH": PACKAGE_ROOT}
    )


@pytest.mark.parametrize("args", [["status"], ["doctor"], ["reproduce"], ["bench", "--quick"]])
def test_without_unsloth_every_command_says_what_to_install(args, without_unsloth, places):
    done = run(args, places, command=without_unsloth.command, env=without_unsloth.env, timeout=60)
    assert f"Unsloth is not installed; install it with: {INSTALL}" in only_line(done, 3)
    assert left_behind(places) == {}


def test_without_unsloth_doctor_json_still_prints_its_report(without_unsloth, places):
    done = run(["doctor", "--json"], places, command=without_unsloth.command, env=without_unsloth.env, timeout=60)
    report = json.loads(done.stdout)
    assert done.returncode == report["exit"] == 3 and report["versions"]["unsloth"] is None
    assert INSTALL in report["error"] and report["mode"] == "pending"


def test_without_unsloth_the_version_says_so_and_apply_names_what_to_install(without_unsloth, places):
    done = run(["--version"], places, command=without_unsloth.command, env=without_unsloth.env)
    assert done.stdout.strip() == f"{PROG} {unsloth_diffusion_norm.__version__} (Unsloth not installed)"
    done = run(
        ["-c", "import unsloth_diffusion_norm; unsloth_diffusion_norm.apply()"],
        places,
        command=[without_unsloth.python],
        env=without_unsloth.env,
    )
    assert done.stderr.strip().splitlines()[-1] == (
        f"RuntimeError: unsloth_diffusion_norm: Unsloth is not installed; install it with: {INSTALL}"
    )


def test_an_unimportable_unsloth_is_one_line_and_exit_3(places):
    line = only_line(run(["status"], places, command=blocked("torch"), timeout=60), 3)
    assert "is installed but `import unsloth` fails: ImportError" in line
    done = run(["doctor", "--json"], places, command=blocked("torch"), timeout=60)
    report = json.loads(done.stdout)
    assert done.returncode == report["exit"] == 3 and "`import unsloth` fails" in report["error"]
    assert left_behind(places) == {}


def test_an_unsupported_unsloth_is_one_line_and_exit_2(capsys, drifted):
    from unsloth_diffusion_norm.tools import cli

    with pytest.raises(RuntimeError):
        unsloth_diffusion_norm.apply()
    for args in (["reproduce"], ["bench", "--quick"]):
        assert cli.main(args) == 2
        captured = capsys.readouterr()
        last = captured.err.strip().splitlines()[-1]
        assert last.startswith(f"{PROG} {args[0]}: Unsloth ") and "is not supported" in last
        assert captured.out == ""


# --- real runs: only the report on stdout, nothing left behind ---


def test_status_prints_only_its_report_and_leaves_nothing_behind(places):
    done = run(["status"], places)
    assert done.returncode == 0, done.stderr[-3000:]
    first, *rest = done.stdout.splitlines()
    assert first.startswith("unsloth_diffusion_norm: mode=") and all(line.startswith("  ") for line in rest)
    assert left_behind(places) == {}  # no unsloth_compiled_cache/ here, no torch cache in TMPDIR


def test_doctor_json_is_all_of_stdout_and_leaves_nothing_behind(places, tmp_path):
    home, run_config = tmp_path / "hf_home", tmp_path / "train.yaml"
    # A run's config with every training-noise field: doctor reports them, and its self-check trains with them.
    lines = ("diffusion_noise: per_sample", "diffusion_t_sampler: stratified", "diffusion_complementary_masks: true")
    shape = ("per_device_train_batch_size: 2", "gradient_accumulation_steps: 3")  # the self-check trains at it
    run_config.write_text("\n".join(("learning_rate: 1.0e-5", "diffusion_eval_noise: fixed", *shape, *lines)) + "\n")
    done = run(["doctor", "--json", "--config", str(run_config)], places, env={"HF_HOME": str(home)})
    report = json.loads(done.stdout)  # the whole of stdout: no banner before it
    assert done.returncode == report["exit"] == 0 and report["self_check"]["passed"], done.stderr[-3000:]
    check = report["self_check"]
    assert (check["batch_size"], check["gradient_accumulation_steps"], len(check["counts"])) == (2, 3, 3)
    assert (
        "The run in the config (batch 2 x GA 3 per process) is normalized by its window's masked tokens"
        in (report["verdict"])
    )
    noise = {
        "diffusion_noise": "per_sample",
        "diffusion_t_sampler": "stratified",
        "diffusion_complementary_masks": True,
    }
    assert report["fields"] == {"diffusion_eval_noise": "fixed", **noise} and report["self_check"]["fields"] == noise
    assert left_behind(places) == {}
    assert "modules" not in os.listdir(home)  # the tiny model's remote code was copied into scratch, not here


def test_reproduce_leaves_nothing_behind(places):
    done = run(["reproduce"], places)
    assert done.returncode == 0 and done.stdout.startswith("Unsloth "), done.stderr[-3000:]
    assert left_behind(places) == {}


# --- bench --quick: run once, as a user without matplotlib, every stderr line timed as it arrives ---
# (--no-ddp: its 2 DDP ranks are launched by the Ctrl-C test below, which stops them; the count they make is the
# data-parallel tier's claim, test_data_parallel.py, and its line is bench.render's, test_bench.py)


@pytest.fixture(scope="module")
def quick_bench(tmp_path_factory):
    root = tmp_path_factory.mktemp("quick")
    cwd, tmp, out = (root / name for name in ("cwd", "tmp", "out"))
    for where in (cwd, tmp, out):
        where.mkdir()
    command = [
        *blocked("matplotlib"),
        "bench",
        "--quick",
        "--no-ddp",
        "--plot",
        str(out / "bench.png"),
        "--json",
        str(out / "bench.json"),
    ]
    started = time.monotonic()
    child = subprocess.Popen(
        command,
        cwd=cwd,
        env={**os.environ, "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout = []
    reader = threading.Thread(target=lambda: stdout.append(child.stdout.read()))
    reader.start()
    err = [(time.monotonic() - started, line.rstrip("\n")) for line in child.stderr]
    child.wait(timeout=600)
    reader.join()
    return SimpleNamespace(
        code=child.returncode, out=stdout[0], err=err, seconds=time.monotonic() - started, places=(cwd, tmp), outdir=out
    )


@pytest.mark.once  # our own tooling, the same on every release
def test_quick_bench_reports_every_figure_and_says_it_is_a_smoke_run(quick_bench):
    assert quick_bench.code == 0, "\n".join(line for _, line in quick_bench.err[-40:])
    out = quick_bench.out
    assert "quick smoke run" in out and "none is a measurement" in out
    assert "`import unsloth_diffusion_norm` alone:" in out
    with open(quick_bench.outdir / "bench.json") as f:
        found = json.load(f)
    assert "count collectives" not in out and found["collectives_per_step"] is None  # (--no-ddp)
    from unsloth_diffusion_norm.tools import bench

    rows = len(bench.GRADIENT_ACCUMULATION) * len(bench.variants(found["mode"]))  # every GA, every variant
    assert out.count("| tiny |") == rows and "| larger |" not in out
    assert found["quick"] and found["blocks"] == 2 and len(found["rows"]) == rows
    assert all(r["spread"] is not None and r["samples"] == 2 for r in found["rows"])


@pytest.mark.once  # our own tooling, the same on every release
def test_quick_bench_says_how_to_get_the_plot_without_matplotlib(quick_bench):
    hint = "pip install 'unsloth-diffusion-norm[bench]'"
    assert f"plot: not drawn: matplotlib is not installed ({hint} adds it)" in quick_bench.out
    assert any(hint in line for _, line in quick_bench.err)  # also before the runs start
    assert os.listdir(quick_bench.outdir) == ["bench.json"]


@pytest.mark.once  # our own tooling, the same on every release
def test_quick_bench_is_never_silent_for_long(quick_bench):
    times = [t for t, line in quick_bench.err if line.startswith("bench [")]
    assert len(times) >= 18  # at least a line per training run
    gaps = [b - a for a, b in zip([0.0, *times], [*times, quick_bench.seconds])]
    assert max(gaps) < 20, gaps  # a line at least every 10 s, with room for a loaded machine


@pytest.mark.once  # our own tooling, the same on every release
def test_quick_bench_leaves_nothing_behind(quick_bench):
    assert quick_bench.code == 0 and left_behind(quick_bench.places) == {}


INTERRUPTED = f"{PROG} bench: interrupted; every process it started is stopped and its temporary files are removed"


def interrupt_bench(places, when):
    """`bench --quick` as from a person's shell, Ctrl-C'd once `when(child, stderr line)` says so; returns
    (exit status, stderr after the interrupt, the pids of every process it had started by then)."""
    cwd, tmp = places
    # Ctrl-C's default action, its own session, and none of what Unsloth and earlier runs wrote into this
    # test process's environment.
    shell = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("UNSLOTH_", "ACCELERATE_", "PYTEST_")) or k == "UNSLOTH_ALLOW_CPU"
    }
    child = subprocess.Popen(
        [*CLI, "bench", "--quick"],
        cwd=cwd,
        env={**shell, "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    err, started = "", []
    try:
        for line in child.stderr:
            if when(child, line):
                break
        assert os.listdir(tmp)  # its scratch directory, while it runs
        started = psutil.Process(child.pid).children(recursive=True)
        # Library code with a bare `except:` can swallow a Ctrl-C that lands inside it (seen once under
        # load: the bench ran on to exit 0); a person presses it again, so does the test.
        for _ in range(10):
            child.send_signal(signal.SIGINT)
            try:
                out, err = child.communicate(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
    finally:
        child.kill()
        child.wait()
    return child.returncode, err, started


def command_line(process):
    try:
        return " ".join(process.cmdline())
    except psutil.Error:  # gone, or a zombie: not a rank that is up
        return ""


def is_rank(command):
    """A launched rank, not the torchrun that launched it (whose command line carries the rank's)."""
    return (
        "unsloth_diffusion_norm.proof." in command and "--worker" in command and "torch.distributed.run" not in command
    )


def importing_torch(process):
    """torch's library mapped into the process: its imports are under way (an event, not a guessed delay)."""
    with contextlib.suppress(psutil.Error):
        return any("libtorch" in os.path.basename(m.path) for m in process.memory_maps())
    return False


def still_running(processes):
    def alive(process):
        try:
            return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    return [p.pid for p in processes if alive(p)]


def running_with_tmpdir_in(tmp):
    """Every live process whose environment points into `tmp` (the bench's and all its descendants')."""
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.environ().get("TMPDIR", "").startswith(str(tmp)) and still_running([process]):
                found.append(process.pid)
    return found


@pytest.mark.once  # our own tooling, the same on every release
def test_ctrl_c_while_the_bench_ranks_are_up_stops_every_process_it_started_and_removes_every_file(places):
    """Interrupted once its training runs are done (checkpoint, run folders and compiled cache written) and its
    2 DDP ranks are up: every process stopped, every temporary file removed. torchrun puts each rank in a
    session of its own: the old bench, interrupted a few seconds after its ranks appeared, killed torchrun
    alone and left the ranks running for ever, holding its scratch files."""
    workers = []

    def ranks_up(child, line):
        if "count collectives" not in line:
            return False
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            workers[:] = [p for p in psutil.Process(child.pid).children(recursive=True) if is_rank(command_line(p))]
            if len(workers) == 2 and all(map(importing_torch, workers)):
                return True  # both ranks importing torch and Unsloth: where the old code leaked them
            time.sleep(0.1)
        raise AssertionError("the bench's 2 ranks never appeared")

    code, err, started = interrupt_bench(places, ranks_up)
    assert len(workers) == 2 and {p.pid for p in workers} <= {p.pid for p in started}
    assert code == 130 and "Traceback" not in err, (code, err[-2000:])
    assert still_running(started) == [] and running_with_tmpdir_in(places[1]) == []
    assert err.strip().splitlines()[-1] == INTERRUPTED
    assert left_behind(places) == {}
