"""A process that imports the heavy third-party libraries once (argv: module
names) and then forks a fresh process per runner script it is asked to run:
the child runs the script as `python SCRIPT ARGS` would, to the end of the
interpreter (threads joined, atexit, the excepthook for what escapes, the
exit status). A name with a leading "-" is made absent instead (a runner that sets
``sys.modules[name] = None`` before its imports). Started and spoken to by
tests/helpers/forked.py.

Why: a runner's process spent 2-6 CPU-s importing TensorFlow or torch before
its first line of test (the suite's largest cost after `dvc` itself). What
a child shares with its siblings is what the zygote imported (no dvc_dali
module, no thread: checked before each fork, and refused; no DALI
pipeline, no TensorFlow op) and its hash seed; everything the product does happens in
the child. Requests come as one JSON line each on stdin; the answers are
two JSON lines on stdout: the child's pid, then its exit code (negative: the
signal that ended it, as subprocess gives it).
"""

from __future__ import annotations

import importlib
import json
import os
import sys


def _serve() -> dict:
    """Returns only in a forked child, with the request it is to run."""
    for line in sys.stdin:
        request = json.loads(line)
        unfit = _unfit()
        if unfit:
            print(json.dumps({"unfit": unfit}), flush=True)
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            return request
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)
    sys.exit(0)  # the client closed stdin: its process is ending


def _unfit() -> str:
    """Why a child forked now would not start fresh ("" when it would): a
    thread (only the forking one would go on, holding whatever locks the
    others held), or a dvc_dali module (the product's state must be the
    child's own)."""
    threads = len(os.listdir("/proc/self/task"))
    ours = sorted(m for m in sys.modules if m.split(".")[0] == "dvc_dali")
    return (f"{threads} threads " if threads > 1 else "") + (" ".join(ours))


def _become(request: dict) -> str:
    """This child's cwd, environment, standard streams and argv, as the
    script's own process would have them; returns the script's path."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    for fd, target in ((null, 0), (out, 1), (err, 2)):
        os.dup2(fd, target)
        os.close(fd)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # the zygote's buffer is not ours
    script, *args = request["argv"]
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    return script


if __name__ == "__main__":
    for _name in sys.argv[1:]:  # "-name": absent to whoever imports it, as the runner has it
        if _name.startswith("-"):
            sys.modules[_name[1:]] = None  # type: ignore[assignment]
        else:
            importlib.import_module(_name)
    _script = _become(_serve())
    import runpy

    runpy.run_path(_script, run_name="__main__")
