"""MkDocs hook: the `dvc-dali` command's reference, generated at build time.

Each `<!-- dvc-dali-help: SUBCOMMAND -->` line of a page becomes the
`--help` of that subcommand (`<!-- dvc-dali-help: -->`: the command's own),
printed by the parser the command itself builds (dvc_dali.cli.main.build_parser),
so the page cannot drift from the code. A subcommand the parser has and the
page has no marker for fails the build, as does a marker for one it lacks.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
from pathlib import Path

MARKER = re.compile(r"^<!-- dvc-dali-help: *([\w-]*) *-->$", re.MULTILINE)
ROOT = Path(__file__).resolve().parents[2]


def _cli():
    if str(ROOT) not in sys.path:  # this tree's dvc_dali, not whichever is installed
        sys.path.insert(0, str(ROOT))
    from dvc_dali.cli import main as cli

    if not Path(cli.__file__).resolve().is_relative_to(ROOT):
        raise RuntimeError(f"dvc_dali.cli was imported from {cli.__file__}, not {ROOT}")
    return cli


def _help(args: list[str]) -> str:
    cli = _cli()
    os.environ["COLUMNS"] = "88"  # argparse wraps to the terminal: the same text everywhere
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        cli.build_parser().parse_args([*args, "--help"])
    return out.getvalue().rstrip()


def subcommands() -> list[str]:
    """The subcommands, as the parser knows them."""
    parser = _cli().build_parser()
    return [name for action in parser._actions  # noqa: SLF001 (argparse names none publicly)
            if isinstance(action, argparse._SubParsersAction)  # noqa: SLF001
            for name in action.choices]


def on_page_markdown(markdown: str, page, config, files) -> str:
    named = MARKER.findall(markdown)
    if not named:
        return markdown
    known = subcommands()
    missing = [c for c in known if c not in named]
    unknown = [c for c in named if c and c not in known]
    if missing or unknown:
        raise ValueError(f"{page.file.src_path}: dvc-dali-help markers: no marker for "
                         f"{missing}, markers for unknown subcommands {unknown}")
    return MARKER.sub(lambda m: "```text\n" + _help([m.group(1)] if m.group(1) else [])
                      + "\n```", markdown)
