"""The process that started this one (`dvc exp run`), through a shell or a
launcher; when a process started."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dvc_dali.core import ancestry


@pytest.mark.parametrize("ancestors, found", [
    ([(10, "dvc", "5")], (10, "5")),  # bash and zsh exec a lone command
    ([(11, "sh", "6"), (10, "dvc", "5")], (10, "5")),  # dash stays between
    ([(12, "bash", "7"), (11, "sh", "6"), (10, "python3", "5")], (10, "5")),
    ([(11, "sh", "6")], None),  # only shells up to init
    ([], None),  # no /proc
])
def test_the_starter_is_the_first_ancestor_that_is_no_shell(ancestors, found):
    assert ancestry.starter_in(ancestors) == found


CHILD = "from dvc_dali.core import ancestry; s = ancestry.starter(); print(s.pid, ancestry.gone(s))"


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="no /proc")
@pytest.mark.parametrize("through_shell", [False, True])
def test_a_real_starter_is_found_through_a_shell_and_is_not_gone(through_shell):
    command = [sys.executable, "-c", CHILD]
    if through_shell:
        command = ["/bin/sh", "-c", f"{sys.executable} -c '{CHILD}'; true"]  # no exec
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout.split()
    assert out == [str(os.getpid()), "False"]


def test_a_starter_that_is_no_ancestor_is_gone():
    assert ancestry.gone(ancestry.Starter(os.getppid(), "1"))  # a pid reused since
    assert ancestry.gone(ancestry.Starter(os.getpid() + 10**6, ""))  # no /proc: the parent


@pytest.mark.parametrize("argv, dvc", [
    (["/usr/bin/python3", "/venv/bin/dvc", "exp", "run", "-n", "a"], True),  # a script
    (["python", "-m", "dvc", "exp", "exec-run", "--infofile", "x"], True),  # --temp, queued
    (["dvc", "exp", "run"], True),
    (["/venv/bin/dvc", "repro"], False),
    (["python", "dvc-dali", "run", "exp"], False),  # `dvc-dali run`: a watcher, not DVC
    (["python", "train.py", "dvc", "exp"], False),  # a script's own arguments: not DVC
    (["python3", "sched.py", "--", "/venv/bin/dvc", "exp", "run"], False),
    (["python3.11", "-u", "-X", "dev", "/venv/bin/dvc", "exp", "run"], True),
    (["dvc", "-v", "exp", "run"], True),  # DVC's own options before its command
    (["dvc", "--cd", "sub", "exp", "run"], True),
    (["dvc", "--cd", "exp", "repro"], False),  # `exp` is --cd's folder here
    (["python", "-c", "import dvc; dvc exp"], False),
    (["python", "-m"], False),
    (["bash", "-c", "dvc exp run"], False),  # the shell: DVC is its parent
    (["torchrun", "--nproc-per-node", "2", "train.py"], False),
    ([], False),
])
def test_dvcs_experiment_processes_are_told_by_their_command_line(argv, dvc):
    assert ancestry.is_dvc_exp(argv) is dvc


LAUNCHER = """
import subprocess, sys
subprocess.run([sys.executable, "-c", sys.argv[1]], check=True)  # torchrun, `timeout`...
"""
RANK = ("import os; from dvc_dali.core import ancestry; "
        "print(ancestry.starter(through_launchers=True).pid, ancestry.starter().pid, os.getppid())")


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="no /proc")
def test_dvcs_process_is_found_through_a_launcher(tmp_path):
    """A rank under torchrun under `dvc exp run`: its parent is the launcher,
    which outlives DVC; the orphan check watches DVC's process itself."""
    fake = tmp_path / "dvc"  # a script named dvc, as DVC's console script is
    fake.write_text(f"#!{sys.executable}\nimport subprocess, sys\n"
                    "print(__import__('os').getpid(), flush=True)\n"
                    "subprocess.run([sys.executable, '-c', *sys.argv[3:]], check=True)\n")
    fake.chmod(0o755)
    out = subprocess.run([str(fake), "exp", "run", LAUNCHER, RANK], capture_output=True, text=True,
                         check=True).stdout.split()
    dvc_pid, through, plain, parent = (int(x) for x in out)
    assert through == dvc_pid and plain == parent != dvc_pid


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="no /proc")
def test_a_process_start_is_read_to_the_clock_tick():
    """psutil's create_time reads up to a second early (btime is whole
    seconds): a ref lock left just before a run started was taken as a live
    writer's and left in the row's way (test_cli's run wrapper test, on a
    quick machine)."""
    import time

    before = time.time()
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    after = time.time()
    try:
        started = ancestry.started_at(child.pid)
    finally:
        child.communicate()
    tick = 1 / os.sysconf("SC_CLK_TCK")
    assert started is not None and before - 2 * tick <= started <= after + 2 * tick, \
        (before, started, after)


@pytest.mark.parametrize("argv, recorder", [
    (["/usr/bin/python3", "/venv/bin/dvc", "exp", "run"], True),  # DVC 2
    (["/venv/bin/dvc", "repro"], True),
    (["python", "-m", "dvc", "exp", "queue-worker", "w"], True),
    (["python", "/venv/bin/dvc-dali", "run", "--", "python", "train.py"], True),
    (["python", "-m", "dvc_dali", "run", "--", "python", "train.py"], True),
    (["python", "-m", "dvc_dali.cli.main", "run"], True),
    (["bash"], False),  # DVC_CHECKPOINT left set in a shell
    (["python", "-m", "pytest"], False),
    (["python", "-m"], False),
    (["python", "train.py", "--out", "dvc"], False),  # a script's own arguments
    (["python", "-u", "/venv/bin/dvc", "repro"], True),
    ([], False),
])
def test_a_process_that_answers_the_checkpoint_signal_is_told_by_its_command_line(
        argv, recorder):
    assert ancestry.is_recorder(argv) is recorder
