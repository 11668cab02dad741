"""The process that started this one (`dvc exp run`), through a shell."""

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
