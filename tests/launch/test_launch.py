"""Tests for tfgc.launch: the local multi-worker launcher."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tfgc import launch

REPO = Path(__file__).resolve().parents[2]


def _py(code: str) -> list[str]:
    """Returns a worker command running ``code`` with this interpreter."""
    return [sys.executable, "-c", textwrap.dedent(code)]


def _run(code: str, num_workers: int, **kwargs) -> tuple[int, str]:
    out = io.StringIO()
    kwargs.setdefault("grace", 2.0)
    code = launch.run(_py(code), num_workers, output=out, **kwargs)
    return code, out.getvalue()


def _alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (Linux /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    # The state letter follows the parenthesised command name.
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _worker_lines(text: str, index: int) -> list[str]:
    prefix = f"[worker {index}] "
    return [
        line[len(prefix) :]
        for line in text.splitlines()
        if line.startswith(prefix)
    ]


def test_tf_config_per_worker_and_distinct_ports():
    code, text = _run(
        """
        import json, os
        print(json.dumps({
            "tf_config": json.loads(os.environ["TF_CONFIG"]),
            "index": os.environ["TFGC_WORKER_INDEX"],
            "num": os.environ["TFGC_NUM_WORKERS"],
            "unbuffered": os.environ.get("PYTHONUNBUFFERED"),
        }))
        """,
        3,
        timeout=60,
    )
    assert code == 0, text
    clusters = []
    for index in range(3):
        (line,) = _worker_lines(text, index)
        seen = json.loads(line)
        assert seen["tf_config"]["task"] == {"type": "worker", "index": index}
        assert seen["index"] == str(index)
        assert seen["num"] == "3"
        assert seen["unbuffered"] == "1"
        clusters.append(seen["tf_config"]["cluster"])
    assert clusters[0] == clusters[1] == clusters[2]
    workers = clusters[0]["worker"]
    assert len(workers) == 3
    assert all(w.startswith("localhost:") for w in workers)
    assert len({w.split(":")[1] for w in workers}) == 3


def test_helpers():
    spec = json.loads(launch.tf_config(2, [1234, 5678], 1))
    assert spec == {
        "cluster": {"worker": ["localhost:1234", "localhost:5678"]},
        "task": {"type": "worker", "index": 1},
    }
    ports = launch.free_ports(4)
    assert len(set(ports)) == 4
    with pytest.raises(ValueError, match="one port per worker"):
        launch.cluster_spec(3, [1, 2])
    with pytest.raises(ValueError, match="index=2"):
        launch.tf_config(2, [1, 2], 2)


def test_hosts_split_workers_over_loopback_addresses():
    assert launch.host_names(4) == ["localhost"] * 4
    assert launch.host_names(4, 2) == [
        "127.0.0.1",
        "127.0.0.1",
        "127.0.0.2",
        "127.0.0.2",
    ]
    for bad in (3, 0, 255):
        with pytest.raises(ValueError, match=f"hosts={bad} must be"):
            launch.host_names(4 if bad != 255 else 510, bad)
    code, text = _run(
        """
        import json, os
        print(json.dumps(json.loads(os.environ["TF_CONFIG"])["cluster"]))
        """,
        4,
        timeout=60,
        hosts=2,
    )
    assert code == 0, text
    workers = json.loads(_worker_lines(text, 3)[0])["worker"]
    hosts = [w.rsplit(":", 1)[0] for w in workers]
    assert hosts == ["127.0.0.1", "127.0.0.1", "127.0.0.2", "127.0.0.2"]


def test_output_is_prefixed_per_worker_including_stderr():
    code, text = _run(
        """
        import os, sys
        i = os.environ["TFGC_WORKER_INDEX"]
        print(f"hello from {i}")
        print(f"oops from {i}", file=sys.stderr)
        """,
        2,
        timeout=60,
    )
    assert code == 0, text
    for index in range(2):
        lines = _worker_lines(text, index)
        assert f"hello from {index}" in lines
        assert f"oops from {index}" in lines
    assert "all 2 worker(s) exited 0" in text


def test_env_and_cwd_are_passed(tmp_path):
    code, text = _run(
        "import os; print(os.environ['EXTRA'], os.getcwd())",
        1,
        env={"EXTRA": "yes"},
        cwd=tmp_path,
        timeout=60,
    )
    assert code == 0, text
    assert _worker_lines(text, 0) == [f"yes {tmp_path}"]


def test_failing_worker_stops_others_and_returns_its_code():
    start = time.monotonic()
    code, text = _run(
        """
        import os, subprocess, sys, time
        if os.environ["TFGC_WORKER_INDEX"] == "1":
            time.sleep(0.5)
            sys.exit(3)
        # A grandchild must die with its worker's process group.
        child = subprocess.Popen([sys.executable, "-c",
                                  "import time; time.sleep(60)"])
        print("grandchild", child.pid, flush=True)
        time.sleep(60)
        """,
        2,
        timeout=60,
    )
    elapsed = time.monotonic() - start
    assert code == 3, text
    assert elapsed < 15, text
    assert "worker 1 failed with exit code 3" in text
    (line,) = [x for x in _worker_lines(text, 0) if x.startswith("grandchild")]
    grandchild = int(line.split()[1])
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)


def test_worker_ignoring_sigterm_is_killed_after_grace():
    code, text = _run(
        """
        import os, signal, sys, time
        if os.environ["TFGC_WORKER_INDEX"] == "1":
            time.sleep(0.5)
            sys.exit(5)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(60)
        """,
        2,
        timeout=60,
        grace=0.5,
    )
    assert code == 5, text


def test_worker_killed_by_signal_reports_128_plus_n():
    code, text = _run("import os; os.kill(os.getpid(), 9)", 1, timeout=60)
    assert code == 128 + 9
    assert "worker 0 was killed by SIGKILL" in text


def test_timeout_returns_124():
    start = time.monotonic()
    code, text = _run("import time; time.sleep(60)", 2, timeout=1.0)
    assert code == launch.EXIT_TIMEOUT == 124
    assert time.monotonic() - start < 10
    assert "timeout of 1 s expired" in text


def test_missing_program_returns_127():
    out = io.StringIO()
    code = launch.run(["/nonexistent/program"], 2, output=out)
    assert code == 127
    assert "cannot start worker 0" in out.getvalue()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"command": [], "num_workers": 1}, "command is empty"),
        ({"command": "python x.py", "num_workers": 1}, "shlex.split"),
        ({"command": ["x"], "num_workers": 0}, "num_workers must be >= 1"),
        ({"command": ["x"], "num_workers": 1, "timeout": 0}, "timeout"),
    ],
)
def test_run_rejects_bad_arguments(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        launch.run(**kwargs)


@pytest.mark.parametrize(
    "argv, match",
    [
        (["-n", "0", "--", "true"], "-n/--num-workers: must be >= 1, got 0"),
        (["-n", "two", "--", "true"], "-n/--num-workers: expected an int"),
        (["-n", "2"], "missing worker command: put it after '--'"),
        (["-n", "2", "--"], "missing worker command"),
        (["-n", "2", "--timeout", "0", "--", "true"], "--timeout: must be > 0"),
        (["-n", "2", "--timeout", "-3", "--", "true"], "got -3"),
        (["-n", "2", "--port-base", "65535", "--", "true"], "--port-base"),
        (["-n", "3", "--hosts", "2", "--", "true"], "--hosts: hosts=2"),
        (["--", "true"], "-n/--num-workers"),
    ],
)
def test_cli_rejects_bad_arguments(argv, match, capsys):
    with pytest.raises(SystemExit) as exc:
        launch.main(argv)
    assert exc.value.code == 2
    assert match in capsys.readouterr().err


def _cli(*args: str) -> list[str]:
    """Returns a launcher command line (``python -m tfgc.launch ...``)."""
    return [sys.executable, "-m", "tfgc.launch", *args]


def _cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), env.get("PYTHONPATH")) if p
    )
    return env


def test_cli_end_to_end_passes_worker_options_through():
    result = subprocess.run(
        _cli(
            "-n",
            "2",
            "--timeout",
            "60",
            "--",
            *_py("import sys; print('args', sys.argv[1:]); sys.exit(0)"),
            "-n",
            "7",
        ),
        env=_cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for index in range(2):
        assert f"[worker {index}] args ['-n', '7']" in result.stdout


def test_cli_exits_with_failing_worker_code():
    result = subprocess.run(
        _cli("-n", "2", "--", *_py("import sys; sys.exit(7)")),
        env=_cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 7, result.stdout + result.stderr


def test_cli_sigterm_stops_workers_and_exits_143():
    proc = subprocess.Popen(
        _cli(
            "-n",
            "2",
            "--grace",
            "2",
            "--",
            *_py(
                "import os, time; print('pid', os.getpid(), flush=True); "
                "time.sleep(60)"
            ),
        ),
        env=_cli_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        pids = []
        while len(pids) < 2:
            line = proc.stdout.readline()
            assert line, "launcher exited before both workers started"
            if "] pid " in line:
                pids.append(int(line.split()[-1]))
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143
    assert "got SIGTERM" in rest
    assert not any(_alive(pid) for pid in pids)


# A stand-in for a training main: on SIGTERM it "saves a backup" for
# SAVE_S seconds, writes DIR/saved-<index> with the number of SIGTERMs it
# got, and exits 3 (the mains exit non-zero when stopped).
_SAVING_WORKER = """
import os, signal, sys, time
directory, save_s = sys.argv[1], float(sys.argv[2])
index = os.environ["TFGC_WORKER_INDEX"]
terms = []

def on_sigterm(signum, frame):
    terms.append(signum)
    if len(terms) > 1:
        return
    time.sleep(save_s)
    with open(os.path.join(directory, "saved-" + index), "w") as f:
        f.write(str(len(terms)))
    sys.exit(3)

signal.signal(signal.SIGTERM, on_sigterm)
print("ready", os.getpid(), flush=True)
while True:
    time.sleep(0.1)
"""


def _start_saving_workers(tmp_path, save_s, *options):
    """Starts the launcher over 2 `_SAVING_WORKER`s; waits for both.

    Returns:
        `(launcher process, worker pids, lines read so far)`.
    """
    proc = subprocess.Popen(
        _cli(
            "-n",
            "2",
            *options,
            "--",
            sys.executable,
            "-c",
            _SAVING_WORKER,
            str(tmp_path),
            str(save_s),
        ),
        env=_cli_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    pids, lines = [], []
    while len(pids) < 2:
        line = proc.stdout.readline()
        assert line, "launcher exited before both workers started"
        lines.append(line)
        if "] ready " in line:
            pids.append(int(line.split()[-1]))
    return proc, pids, lines


def _finish(proc, timeout=90) -> str:
    try:
        rest, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return rest


@pytest.mark.parametrize(
    "sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)]
)
def test_signal_is_forwarded_once_and_workers_get_the_default_grace(
    tmp_path, sig, code
):
    # Saving takes 7 s, longer than the 5 s the launcher used to allow:
    # the default grace must let both workers finish.
    proc, pids, _ = _start_saving_workers(tmp_path, 7)
    proc.send_signal(sig)
    rest = _finish(proc)
    assert proc.returncode == code, rest
    for index in range(2):
        # Saved, and got SIGTERM exactly once.
        assert (tmp_path / f"saved-{index}").read_text() == "1", rest
    assert f"waiting up to {launch.DEFAULT_GRACE:g} s" in rest
    # Above the mains' default --stop_timeout, their bound to save and exit.
    assert launch.DEFAULT_GRACE > 30
    assert "SIGKILL" not in rest
    assert not any(_alive(pid) for pid in pids)


def test_grace_is_configurable_and_ends_in_sigkill(tmp_path):
    proc, pids, _ = _start_saving_workers(tmp_path, 60, "--grace", "1")
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)
    rest = _finish(proc)
    assert proc.returncode == 130, rest
    assert time.monotonic() - start < 30, rest
    assert "worker(s) [0, 1] still running after 1 s; killed with SIGKILL" in (
        rest
    )
    assert not list(tmp_path.glob("saved-*"))
    assert not any(_alive(pid) for pid in pids)


def test_second_ctrl_c_kills_at_once(tmp_path):
    proc, pids, _ = _start_saving_workers(tmp_path, 60, "--grace", "120")
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)
    while True:
        line = proc.stdout.readline()
        assert line, "launcher exited before it waited for the workers"
        if "waiting up to 120 s" in line:
            break
    proc.send_signal(signal.SIGINT)
    rest = _finish(proc)
    assert proc.returncode == 130, rest
    # Well before the 120 s grace (and the workers' 60 s of saving).
    assert time.monotonic() - start < 45, rest
    assert "worker(s) [0, 1] asked again; killed with SIGKILL" in rest
    assert not any(_alive(pid) for pid in pids)


def test_stop_workers_reports_who_was_killed():
    procs = [
        subprocess.Popen(
            _py(
                f"""
                import signal, time
                if {i} == 1:
                    signal.signal(signal.SIGTERM, signal.SIG_IGN)
                print("ready", flush=True)
                time.sleep(60)
                """
            ),
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        for i in range(2)
    ]
    for proc in procs:
        assert proc.stdout.readline() == b"ready\n"
        proc.stdout.close()
    stopped = launch.stop_workers(procs, grace=0.5)
    assert stopped == launch.Stopped(killed=(1,), interrupted=False)
    assert procs[0].returncode == -signal.SIGTERM
    assert procs[1].returncode == -signal.SIGKILL


_BANNERS = (
    "WARNING: All log messages before absl::InitializeLog() is called are "
    "written to STDERR",
    "I0000 00:00:1795739909.243028    3642 port.cc:153] oneDNN custom "
    "operations are on.",
    "W0000 00:00:1795739909.243028    3642 x.cc:1] early warning",
    "E0000 00:00:1795739909.243028    3642 x.cc:2] early error",
)


@pytest.mark.parametrize(
    "kwargs, shown",
    [
        ({}, [3]),
        ({"verbose": True}, [0, 1, 2, 3]),
        ({"env": {"TF_CPP_MIN_LOG_LEVEL": "0"}}, [0, 1, 2, 3]),
        ({"env": {"TF_CPP_MIN_LOG_LEVEL": "1"}}, [0, 2, 3]),
    ],
)
def test_tensorflow_start_up_lines_follow_the_log_level(
    kwargs, shown, monkeypatch
):
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    code, text = _run(
        f"""
        import os, sys
        print("level", os.environ.get("TF_CPP_MIN_LOG_LEVEL"))
        for line in {_BANNERS!r}:
            print(line, file=sys.stderr)
        print("I1127 00:38:38.353333 1 x.py:1] a normal line")
        """,
        1,
        timeout=60,
        **kwargs,
    )
    assert code == 0, text
    lines = _worker_lines(text, 0)
    # The launcher sets level 2 unless asked for everything or given one.
    expected_level = kwargs.get("env", {}).get(
        "TF_CPP_MIN_LOG_LEVEL", None if kwargs.get("verbose") else "2"
    )
    assert lines[0] == f"level {expected_level}"
    assert [line for line in lines if line in _BANNERS] == [
        _BANNERS[i] for i in shown
    ]
    assert lines[-1] == "I1127 00:38:38.353333 1 x.py:1] a normal line"


@pytest.mark.parametrize(
    "code",
    [
        "import tfgc.launch",
        "import tfgc, tfgc.launch, tfgc.quiet",
        # What `python -m tfgc.launch --help` runs.
        "import runpy, sys\n"
        "sys.argv = ['launch', '--help']\n"
        "try:\n"
        "    runpy.run_module('tfgc.launch', run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code",
    ],
)
def test_launcher_does_not_import_tensorflow(code):
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            code + "\nimport sys\nprint('tf', 'tensorflow' in sys.modules)",
        ],
        env=_cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "tf False", result.stdout


def test_lazy_tfgc_loads_on_first_use():
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                """
                import sys
                import tfgc
                assert "tensorflow" not in sys.modules
                from tfgc import _keras_compat
                opt = tfgc.CompressedOptimizer
                assert "tensorflow" in sys.modules
                assert opt.__name__ == "CompressedOptimizer"
                assert tfgc.compressors.get("topk").density == 0.01
                assert tfgc.callbacks.CompressionStats
                assert tfgc.communicators.names()
                assert tfgc.ops.top_k_abs
                assert "CompressedOptimizer" in dir(tfgc)
                # The model.fit fix is in place, as `import tfgc` did.
                assert _keras_compat._trainer is not None
                try:
                    tfgc.no_such_name
                except AttributeError as err:
                    assert "no_such_name" in str(err)
                else:
                    raise AssertionError("no AttributeError")
                print("OK")
                """
            ),
        ],
        env=_cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.stdout.strip().endswith("OK"), result.stderr


_ALL_REDUCE_WORKER = """
import os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()

@tf.function
def step():
    def replica_fn():
        ctx = tf.distribute.get_replica_context()
        return ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.constant(1.0))
    return strategy.run(replica_fn)

result = strategy.experimental_local_results(step())[0]
print("allreduce_sum", float(result.numpy()), flush=True)
"""


@pytest.mark.multiworker
@pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None,
    reason="needs TensorFlow",
)
def test_two_real_workers_all_reduce():
    out = io.StringIO()
    code = launch.run(
        [sys.executable, "-c", _ALL_REDUCE_WORKER],
        2,
        timeout=180,
        env={"CUDA_VISIBLE_DEVICES": ""},
        output=out,
    )
    text = out.getvalue()
    assert code == 0, text
    for index in range(2):
        assert "allreduce_sum 2.0" in _worker_lines(text, index), text
