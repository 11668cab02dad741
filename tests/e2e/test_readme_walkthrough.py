"""README.md and the documentation site are a test: their commands, run
literally in the order written.

The main job's command (the first of README's "The two commands"), then
every ```sh block of the site's pages (docs/, mkdocs.yml's nav) in the
navigation's order: "Your first hour" in a fresh copy of this project, the
Quickstart in a new directory. The Get started pages include README's own
sections (`--8<-- "README.md:<section>"`, expanded here as pymdownx.snippets
does), so these are README's commands too. Each command's expectation is
listed below in that order; the test first checks that the pages' commands
are exactly these, so a change of a page or of README fails here until this
list changes with it. A command not run is listed with the reason.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.dvc_project import REPO, make_project, model_sha
from tests.helpers.rows import exp_rows

README = REPO / "README.md"
DOCS = REPO / "docs"
MAIN_JOB = 'python3 -m pip install -e ".[example]" && dvc exp run'
# Installing would point this environment's editable install at the temporary
# copy; the test environment has these extras installed already (.ci/run).
SKIPPED = {'python3 -m pip install -e ".[example]"':
           "installs the extras the test environment already has"}
SNIPPET = re.compile(r'^--8<-- "([^":]+)(?::([\w-]+))?"$', re.M)


def _section(path: Path, name: str | None) -> str:
    """A file, or its part between `--8<-- [start:name]` and `[end:name]`."""
    text = (REPO / path).read_text()
    if name is None:
        return text
    found = re.search(rf"^[^\n]*--8<-- \[start:{name}\][^\n]*\n(.*?)^[^\n]*--8<-- \[end:{name}\]",
                      text, re.M | re.S)
    assert found, f"{path}: no snippet section {name!r} (the docs include it)"
    return found.group(1)


def page_text(page: str) -> str:
    """A page of docs/ as the site shows it: its snippets included."""
    return SNIPPET.sub(lambda m: _section(Path(m.group(1)), m.group(2)),
                       (DOCS / page).read_text())


def nav_pages() -> list[str]:
    """The site's pages, in mkdocs.yml's navigation order."""
    def walk(items):
        for item in items:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            if isinstance(value, list):
                yield from walk(value)
            else:
                yield value
    return list(walk(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]))


def readme_commands() -> list[tuple[str, str]]:
    """(page title, command) for the main job's command and every ```sh
    block's lines, comments stripped, in the pages' order."""
    assert f"    {MAIN_JOB}\n" in README.read_text(), "README's main-job command changed"
    found: list[tuple[str, str]] = []
    for page in nav_pages():
        text = page_text(page)
        title = re.search(r"^# (.*)$", text, re.M).group(1)
        if f"    {MAIN_JOB}\n" in text:
            found += [("main job", part) for part in MAIN_JOB.split(" && ", 1)]
        for block in re.finditer(r"^```sh\n(.*?)^```$", text, re.M | re.S):
            for line in block.group(1).splitlines():
                command = re.sub(r"\s+#.*$", "", line).strip()
                if command:
                    found.append((title, command))
    return found


class Walk:
    """Runs commands one after another as a shell user would, cd included."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.said: dict[str, str] = {}

    def __call__(self, command: str) -> subprocess.CompletedProcess:
        where = self.cwd / ".walk_cwd"
        script = f"{command}\nrc=$?\npwd > {where}\nexit $rc\n"
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        proc = subprocess.run(["bash", "-c", script], cwd=self.cwd, capture_output=True,
                              text=True, env={**os.environ, "PATH": path,
                                              "PYTHONPATH": str(REPO)}, timeout=1200)
        if where.exists():
            self.cwd = Path(where.read_text().strip())
            where.unlink()
        return proc


def out(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout + proc.stderr


def ok(proc, *words):
    assert proc.returncode == 0, out(proc)[-4000:]
    for word in words:
        assert word in out(proc), f"{word!r} not printed:\n{out(proc)[-4000:]}"


def runs(project: Path) -> dict[str, list[int]]:
    """{run name: its rows' steps} of dvc-dali's rows."""
    found: dict[str, list[int]] = {}
    for name in exp_rows(project):
        run, sep, step = name.rpartition("-step")
        if sep and step.isdigit():
            found.setdefault(run, []).append(int(step))
    return {k: sorted(v) for k, v in found.items()}


def test_readme_commands_run_in_the_order_written(tmp_path):
    state: dict = {}
    walk = Walk(make_project(tmp_path / "clone", example=True))

    def first_run(p):
        ok(p, "Ran experiment(s)")
        (name, steps), = runs(walk.cwd).items()
        assert steps == [10, 20, 30, 40, 50, 60]
        state["model"] = model_sha(walk.cwd)

    def killed(p):
        assert p.returncode != 0, out(p)[-3000:]
        state["killed"] = {n: s for n, s in runs(walk.cwd).items() if s == [10, 20]}
        assert len(state["killed"]) == 1, runs(walk.cwd)

    def resumed(p):
        ok(p, "resuming from step 20")
        assert model_sha(walk.cwd) == state["model"]  # byte for byte, as uninterrupted
        name, = state["killed"]
        assert runs(walk.cwd)[name] == [10, 20, 30, 40, 50, 60]
        state["run"] = name

    def refused(p):
        assert p.returncode != 0 and "Traceback" not in out(p), out(p)[-3000:]
        assert "finished run (step 60 of 60) and nothing changed" in out(p), out(p)[-3000:]

    def further(p):
        ok(p, "resuming from step 60")
        assert runs(walk.cwd)[state["run"]][-2:] == [70, 80]

    def new_run(p):
        ok(p, "finished run")
        assert len(runs(walk.cwd)) == 3

    def best(p):  # README: "the best row of all runs"
        ok(p, "-step")
        rows = {n: r["metrics"]["train"]["acc"] for n, r in exp_rows(walk.cwd).items()
                if re.search(r"-step\d+$", n or "")}
        named = re.search(r"best by train/acc:max: (\S+) ", out(p)).group(1)
        assert rows[named] == max(rows.values()), (named, rows)

    def quickstart(p):
        ok(p, "Ran experiment(s)")
        (name, steps), = runs(walk.cwd).items()
        assert steps == list(range(10, 101, 10))
        state["quick"] = name

    def quick_further(p):
        ok(p)
        assert runs(walk.cwd) == {state["quick"]: list(range(10, 121, 10))}

    expected = [
        ("main job", 'python3 -m pip install -e ".[example]"', None),
        ("main job", "dvc exp run", first_run),
        ("Your first hour, step by step", "dvc exp show", lambda p: ok(p, "-step60")),
        ("Your first hour, step by step", "dvc-dali show", lambda p: ok(p, "step60")),
        ("Your first hour, step by step", "dvc-dali reset", ok),
        ("Your first hour, step by step", "DVC_DALI_EXAMPLE_KILL_AT_STEP=20 dvc exp run", killed),
        ("Your first hour, step by step", "dvc exp run", resumed),
        ("Your first hour, step by step", "dvc exp run", refused),
        ("Your first hour, step by step", "dvc exp run -S train.steps=80", further),
        ("Your first hour, step by step", "dvc exp run -S train.lr=0.05", new_run),
        ("Your first hour, step by step", "dvc-dali show --best train/acc:max", best),
        ("Quickstart for your own script",
         "mkdir my-project && cd my-project && git init -q && dvc init -q", ok),
        ("Quickstart for your own script", "dvc-dali init --digits", lambda p: ok(p, "1797")),
        ("Quickstart for your own script", "git add . && git commit -qm start && dvc exp run",
         quickstart),
        ("Quickstart for your own script", "dvc exp run -S train.steps=120", quick_further),
    ]
    assert readme_commands() == [(s, c) for s, c, _ in expected]
    for section, command, check in expected:
        if check is None:
            assert command in SKIPPED
            continue
        if section.startswith("Quickstart") and command.startswith("mkdir"):
            walk.cwd = tmp_path  # a new directory, outside the example project
        print(f"$ {command}", flush=True)
        check(walk(command))


@pytest.mark.parametrize("command", sorted(SKIPPED))
def test_skipped_commands_are_in_readme(command):
    assert command in README.read_text(), f"{command!r} is no longer in README: unlist it"


def test_every_page_is_in_the_nav_and_the_get_started_pages_include_readme():
    pages = nav_pages()
    on_disk = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert sorted(pages) == on_disk, "docs/: a page not in mkdocs.yml's nav, or the reverse"
    titles = [t for t, _ in readme_commands()]
    assert titles[0] == "main job" and "Your first hour, step by step" in titles
    assert "Quickstart for your own script" in titles
    # README's own ```sh blocks are walked through the pages that include them
    walked = [c for _, c in readme_commands()]
    for block in re.finditer(r"^```sh\n(.*?)^```$", README.read_text(), re.M | re.S):
        for line in block.group(1).splitlines():
            command = re.sub(r"\s+#.*$", "", line).strip()
            assert not command or command in walked, (
                f"README's {command!r} is in no page of the site: put it in a section a "
                "Get started page includes")
