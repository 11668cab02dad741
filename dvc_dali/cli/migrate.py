"""`dvc-dali migrate`: make DVC 2 checkpoint stages resume under DVC 3.

DVC 3 accepts `checkpoint: true` and ignores it: it deletes the output before
each run and skips a stage whose dependencies did not change, so a DVC 2
project ported by changing only the import never resumes. For every stage
with a `checkpoint: true` output this adds `persist: true` to that output and
`always_changed: true` to the stage; a stage whose script trains only when
DVC 2's `DVC_CHECKPOINT` is set (DVC 3 never sets it) gets its command
wrapped in `dvc-dali run`, which sets it and records every signal.

The file is edited as text at the positions ruamel.yaml's round-trip parser
reports, so comments, key order, quoting and indentation stay as written (a
ruamel dump would re-indent the whole file). The result is parsed again and
compared with the intended data before anything is written.
"""

from __future__ import annotations

import argparse
import bisect
import copy
import json
import os
import posixpath
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from ..core import atomic_file
from ..reading import gitcmd
from ..core.checkpoint_outputs import checkpoint_outputs
from ..core.context import SIGNAL_NAME
from ..core.errors import DvcDaliError

# Reads a file named relative to the dvc.yaml's directory: its text, or None.
Reader = Callable[[str], Optional[str]]

MAX_SCRIPT_BYTES = 4 << 20  # larger "scripts" are data files, not worth grepping
_TOKEN = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"\\]|\\.)*\"|[^\s,\]}#]+")
_ASSIGNMENTS = re.compile(r"((?:[A-Za-z_]\w*=(?:'[^']*'|\"(?:[^\"\\]|\\.)*\"|\\.|[^\s'\"\\])*"
                          r"\s+)*)")
_WRAPPED = re.compile(r"(?:^|[\s;&|(])(?:dvc-dali|dvc_dali\.cli)\s+run(?:\s|$)")
_SHELL_OPERATOR = set("();<>|&")


class MigrateError(DvcDaliError):
    """A dvc.yaml that cannot be read or rewritten; the message names it and the fix."""


@dataclass(frozen=True)
class Edit:
    """Replace text[start:end] with ``text`` (an insertion when start == end)."""

    start: int
    end: int
    text: str


@dataclass(frozen=True)
class Change:
    """One thing a checkpoint stage needs to resume under DVC 3."""

    stage: str  # the stage's name in dvc.yaml
    output: str  # its checkpoint output
    adds: str  # what is added or set: "persist: true", "always_changed: true", "cmd: ..."
    why: str  # what DVC 3 does without it
    # Where the change lands in the parsed data, the value it gets there and
    # the text edits making it: used by rewrite() only.
    path: tuple = field(default=(), compare=False, repr=False)
    new: Any = field(default=None, compare=False, repr=False)
    edits: tuple = field(default=(), compare=False, repr=False)

    def __str__(self) -> str:
        where = f"stage '{self.stage}'"
        if self.adds.startswith("persist"):
            where += f", output '{self.output}'"
        return f"{where}: {self.adds}  ({self.why})"


def _no_files(_rel: str) -> Optional[str]:
    return None


def disk_reader(base: Path) -> Reader:
    """A Reader over files under ``base`` (the dvc.yaml's directory)."""
    def read(rel: str) -> Optional[str]:
        path = base / rel
        try:
            if not path.is_file() or path.stat().st_size > MAX_SCRIPT_BYTES:
                return None
            return path.read_text(encoding="utf-8", errors="replace")
        except (OSError, ValueError):  # unreadable, or a name with a NUL byte: not a script
            return None
    return read


# --------------------------------------------------------------------------
# text positions
# --------------------------------------------------------------------------


class _Text:
    """The dvc.yaml text, addressed by ruamel's (line, column) marks."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self.nl = "\r\n" if "\r\n" in text else "\n"  # inserted lines follow the file's

    @property
    def lines(self) -> int:
        return len(self.starts)

    def offset(self, mark: tuple[int, int]) -> int:
        return self.starts[mark[0]] + mark[1]

    def line_of(self, offset: int) -> int:
        return bisect.bisect_right(self.starts, offset) - 1

    def line_end(self, n: int) -> int:
        """Offset of line n's end, before its line break."""
        end = self.starts[n + 1] - 1 if n + 1 < self.lines else len(self.text)
        return end - 1 if self.text[:end].endswith("\r") else end

    def line(self, n: int) -> str:
        return self.text[self.starts[n]:self.line_end(n)]

    def insert_line(self, after: int, indent: int, content: str) -> Edit:
        """A new line ``content`` below line ``after``."""
        if after + 1 < self.lines:
            pos = self.starts[after + 1]
            return Edit(pos, pos, " " * indent + content + self.nl)
        pos = len(self.text)  # the last line
        lead = "" if self.text.endswith("\n") else self.nl
        return Edit(pos, pos, lead + " " * indent + content + (self.nl if lead == "" else ""))

    def block_end(self, first: int, parent_indent: int) -> int:
        """The last line of the block node that starts on line ``first`` under a
        key (or dash) at ``parent_indent``: it ends before the next content line
        indented no deeper. Comments at the parent's indent belong to what follows."""
        last = first
        for n in range(first + 1, self.lines):
            line = self.line(n)
            body = line.lstrip(" ")
            if not body.strip():
                continue
            if len(line) - len(body) > parent_indent:
                last = n
            elif not body.startswith("#"):
                break
        return last


def _skip_quoted(text: str, start: int) -> int:
    """The offset after the quoted scalar that opens at ``start``."""
    quote, i = text[start], start + 1
    while i < len(text):
        if quote == '"' and text[i] == "\\":
            i += 2
            continue
        if text[i] == quote:
            if quote == "'" and text[i + 1:i + 2] == "'":  # '' is a quote inside '...'
                i += 2
                continue
            return i + 1
        i += 1
    return len(text)


def _flow_close(text: str, start: int) -> int:
    """The offset of the bracket closing the flow collection opened at ``start``."""
    depth, i = 0, start
    while i < len(text):
        ch = text[i]
        if ch in "'\"" and text[:i].rstrip()[-1:] in ("[", "{", ",", ":"):
            i = _skip_quoted(text, i)
            continue
        if ch == "#" and text[i - 1:i] in (" ", "\t", "\n"):
            i = text.find("\n", i) if "\n" in text[i:] else len(text)  # skip the comment
            continue
        depth += (ch in "[{") - (ch in "]}")
        if depth == 0:
            return i
        i += 1
    raise MigrateError("a flow collection is not closed")  # ruamel parsed it: cannot happen


# --------------------------------------------------------------------------
# commands: which run DVC 2's protocol, and their wrapped form
# --------------------------------------------------------------------------


def is_wrapped(line: str) -> bool:
    """The command already runs under `dvc-dali run`."""
    return bool(_WRAPPED.search(line))


def _needs_shell(command: str) -> bool:
    """Has operators (&&, |, ;, redirections) that `dvc-dali run -- CMD` would
    hand to the outer shell instead of running under the wrapper."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        return any(set(token) <= _SHELL_OPERATOR for token in lexer)
    except ValueError:  # unbalanced quotes: leave the parsing to a shell
        return True


def wrap_command(line: str, output: str) -> str:
    """``line`` run by `dvc-dali run --checkpoint OUTPUT -- ...`, keeping its
    leading VAR=value assignments in front (they reach the child)."""
    body = line.strip()
    lead = line[:len(line) - len(line.lstrip())]
    prefix = f"dvc-dali run --checkpoint {shlex.quote(output)} -- "
    env = _ASSIGNMENTS.match(body).group(1)
    rest = body[len(env):]
    if _needs_shell(rest):
        return f"{lead}{prefix}sh -c {shlex.quote(body)}"
    return f"{lead}{env}{prefix}{rest}"


def named_files(line: str) -> list[str]:
    """Files a command line may run: its arguments, the values of --opt=value
    and VAR=value, and `-m pkg.mod` as pkg/mod.py or pkg/mod/__main__.py."""
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError:
        tokens = line.split()
    names: list[str] = []
    for prev, token in zip([""] + tokens, tokens):
        if prev == "-m":
            module = token.replace(".", "/")
            names += [f"{module}.py", f"{module}/__main__.py"]
        elif "=" in token:
            names.append(token.split("=", 1)[1])
        elif not token.startswith("-"):
            names.append(token)
    return [n for n in names if n]


# --------------------------------------------------------------------------
# parsing
# --------------------------------------------------------------------------


def _load(text: str, name: str, typ: str = "rt") -> Any:
    from ruamel.yaml import YAML, YAMLError

    try:
        return YAML(typ=typ, pure=True).load(text)
    except YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise MigrateError(f"{name}: not valid YAML{where}: {problem}. Fix the file (DVC cannot "
                           "read it either), then run `dvc-dali migrate` again") from None


def _kind(value: Any) -> str:
    return "list" if isinstance(value, list) else "scalar"


def _stages(doc: Any) -> Iterator[tuple[str, Any, Any, Any, tuple]]:
    """(name, stage definition, the mapping holding it, its key there, data path);
    for a foreach stage the definition is its `do` (matrix stages are plain)."""
    stages = doc.get("stages") if isinstance(doc, dict) else None
    if not isinstance(stages, dict):
        return
    for name, spec in stages.items():
        if not isinstance(spec, dict):
            continue
        if "foreach" in spec and isinstance(spec.get("do"), dict):
            yield str(name), spec["do"], spec, "do", ("stages", name, "do")
        else:
            yield str(name), spec, stages, name, ("stages", name)


def _checkpoint_outs(body: Any, path: tuple) -> Iterator[tuple[str, Any, tuple]]:
    """(output path, its options mapping, data path) of each `checkpoint: true`
    output (checkpoint_outputs.py holds the rule)."""
    for out in checkpoint_outputs(body):
        yield out.path, out.options, path + (out.list_name, out.index, out.key)


def checkpoint_stages(text: str, name: str = "dvc.yaml") -> list[str]:
    """Names of the stages with a `checkpoint: true` output."""
    return [stage for stage, body, _, _, path in _stages(_load(text, name))
            if any(True for _ in _checkpoint_outs(body, path))]


# --------------------------------------------------------------------------
# planning
# --------------------------------------------------------------------------


@dataclass
class _Cmd:
    """One command scalar: `cmd: ...`, or one item of a `cmd:` list."""

    value: str
    start: int  # offset of the scalar in the text
    parent_indent: int  # indent of its key or dash
    flow: bool  # inside a flow collection
    path: tuple


class _Planner:
    def __init__(self, text: str, files: Reader, name: str) -> None:
        self.tx = _Text(text)
        self.files = files
        self.name = name
        self.doc = _load(text, name)
        if self.doc is not None and not isinstance(self.doc, dict):  # /etc/passwd: a string
            raise MigrateError(f"{name}: not a dvc.yaml (YAML whose top level is a "
                               f"{_kind(self.doc)}, not a mapping with `stages`); give the "
                               "path of the project's dvc.yaml")
        self._guarded: dict[str, bool] = {}

    def changes(self) -> list[Change]:
        found: list[Change] = []
        for stage, body, owner, key, path in _stages(self.doc):
            outs = list(_checkpoint_outs(body, path))
            if not outs:
                continue
            for out, opts, out_path in outs:
                found += self._persist(stage, out, opts, out_path)
            found += self._always_changed(stage, outs[0][0], body, owner, key, path)
            found += self._wrap(stage, outs[0][0], body, path)
        return found

    # persist / always_changed ---------------------------------------------

    def _place(self, mapping: Any, key: str) -> tuple[int, int]:
        """Where ``key``'s value is written (line, column); a key merged in
        from an anchor (``<<: *name``) is written nowhere in this mapping."""
        where = mapping.lc.value(key)
        if where is None:
            raise MigrateError(
                f"{self.name}: '{key}' comes into an output's options through a YAML merge "
                "key ('<<: *anchor'), so there is no place in the file to edit beside it. Write "
                f"'{key}' in the output's own options (or add 'persist: true' there by hand), "
                "then run `dvc-dali migrate` again.")
        return where

    def _value_edit(self, mapping: Any, key: str, text: str) -> Edit:
        """Set the existing ``key``'s value to ``text`` (its comment stays)."""
        start = self.tx.offset(self._place(mapping, key))
        token = _TOKEN.match(self.tx.text, start)
        return Edit(start, token.end() if token else start, text)

    def _insert_after(self, mapping: Any, key: str, content: str) -> Edit:
        """``content`` as a new entry right after ``key``'s."""
        if mapping.fa.flow_style():
            token = _TOKEN.match(self.tx.text, self.tx.offset(self._place(mapping, key)))
            return Edit(token.end(), token.end(), f", {content}")
        line = self._place(mapping, key)[0]
        return self.tx.insert_line(line, mapping.lc.key(key)[1], content)

    def _append(self, body: Any, owner: Any, key: Any, content: str) -> Edit:
        """``content`` as a new entry at the end of the mapping ``body``."""
        if body.fa.flow_style():
            close = _flow_close(self.tx.text, self.tx.offset(owner.lc.value(key)))
            pos = len(self.tx.text[:close].rstrip())
            return Edit(pos, pos, f", {content}" if body else content)
        key_line, key_col = owner.lc.key(key)
        last = self.tx.block_end(key_line, key_col)
        return self.tx.insert_line(last, body.lc.key(next(iter(body)))[1], content)

    def _persist(self, stage: str, out: str, opts: Any, path: tuple) -> list[Change]:
        if opts.get("persist") is True:
            return []
        edit = (self._value_edit(opts, "persist", "true") if "persist" in opts
                else self._insert_after(opts, "checkpoint", "persist: true"))
        why = "DVC 3 deletes the output before every run, so training would never resume"
        return [Change(stage, out, "persist: true", why, path + ("persist",), True, (edit,))]

    def _always_changed(self, stage: str, out: str, body: Any, owner: Any, key: Any,
                        path: tuple) -> list[Change]:
        if body.get("always_changed") is True:
            return []
        edit = (self._value_edit(body, "always_changed", "true") if "always_changed" in body
                else self._append(body, owner, key, "always_changed: true"))
        why = "DVC 3 skips a stage whose dependencies did not change instead of resuming it"
        return [Change(stage, out, "always_changed: true", why, path + ("always_changed",),
                       True, (edit,))]

    # the DVC_CHECKPOINT guard ---------------------------------------------

    def _is_guarded(self, wdir: str, name: str) -> bool:
        """The file speaks DVC 2's protocol: it reads or touches DVC_CHECKPOINT."""
        rel = name if posixpath.isabs(name) else posixpath.normpath(posixpath.join(wdir, name))
        if rel not in self._guarded:
            text = self.files(rel) if rel not in (".", "..") else None
            self._guarded[rel] = text is not None and SIGNAL_NAME in text
        return self._guarded[rel]

    def _commands(self, body: Any, path: tuple) -> list[_Cmd]:
        cmd, flow = body.get("cmd"), body.fa.flow_style()
        if isinstance(cmd, str):
            return [_Cmd(cmd, self.tx.offset(body.lc.value("cmd")), body.lc.key("cmd")[1], flow,
                         path + ("cmd",))]
        found = []
        for i, item in enumerate(cmd if isinstance(cmd, list) else []):
            if isinstance(item, str):
                start = self.tx.offset(cmd.lc.item(i))
                dash = len(self.tx.line(self.tx.line_of(start)).split("-")[0])
                found.append(_Cmd(item, start, dash, flow or cmd.fa.flow_style(),
                                  path + ("cmd", i)))
        return found

    def _targets(self, body: Any, cmds: list[_Cmd]) -> tuple[dict[tuple, str], list[str]]:
        """{(command index, line index): line} to wrap, and the guarded scripts.
        DVC runs each line of a command on its own, so lines are wrapped one by
        one: those naming a guarded script; all of them when only a dependency
        is guarded (say `./train` launching it) and none is wrapped yet."""
        wdir = str(body.get("wdir") or ".")
        lines = {(i, j): line for i, c in enumerate(cmds)
                 for j, line in enumerate(c.value.splitlines()) if line.strip()}
        named = {k: [f for f in named_files(line) if self._is_guarded(wdir, f)]
                 for k, line in lines.items()}
        if any(named.values()):
            targets = {k: lines[k] for k, files in named.items() if files
                       and not is_wrapped(lines[k])}
            return targets, sorted({f for k in targets for f in named[k]})
        deps = body.get("deps")
        deps = [d for d in deps if isinstance(d, str) and self._is_guarded(wdir, d)
                ] if isinstance(deps, list) else []
        if not deps or any(is_wrapped(line) for line in lines.values()):
            return {}, []
        return lines, deps

    def _wrap(self, stage: str, out: str, body: Any, path: tuple) -> list[Change]:
        cmds = self._commands(body, path)
        targets, scripts = self._targets(body, cmds)
        why = (f"{', '.join(scripts)} trains only when {SIGNAL_NAME} is set, which DVC 3 never "
               "sets; `dvc-dali run` sets it and records each checkpoint")
        found = []
        for i, cmd in enumerate(cmds):
            wrapped = {j: wrap_command(line, out) for (ci, j), line in targets.items() if ci == i}
            if not wrapped:
                continue
            new = _replace_lines(cmd.value, wrapped)
            edits = tuple(self._scalar_edits(cmd, new, wrapped))
            for n, j in enumerate(sorted(wrapped)):  # the first carries the edits
                found.append(Change(stage, out, f"cmd: {wrapped[j].strip()}", why, cmd.path,
                                    new, edits if n == 0 else ()))
        return found

    # editing a command scalar in its own style ----------------------------

    def _scalar_edits(self, cmd: _Cmd, new: str, wrapped: dict[int, str]) -> list[Edit]:
        text = self.tx.text
        if text[cmd.start] == "|":
            edits = self._literal_edits(cmd, wrapped)
            if edits is not None:
                return edits
        end = _scalar_end(self.tx, cmd)
        # One line keeps its style; folded or multi-line becomes one
        # double-quoted line, exact if not pretty.
        one_line = "\n" not in text[cmd.start:end] and text[cmd.start] not in "|>"
        style = text[cmd.start] if one_line and text[cmd.start] in "'\"" else "plain"
        return [Edit(cmd.start, end, _emit(new, style if one_line else '"', cmd.flow))]

    def _literal_edits(self, cmd: _Cmd, wrapped: dict[int, str]) -> Optional[list[Edit]]:
        """A `|` block's lines are the command's lines one for one: edit those."""
        header = self.tx.line_of(cmd.start)
        digit = re.match(r"\|[+-]?(\d?)", self.tx.text[cmd.start:]).group(1)
        first_n = next((n for n in range(header + 1, self.tx.lines) if self.tx.line(n).strip()),
                       None)
        if first_n is None:
            return None
        first = self.tx.line(first_n)
        indent = (cmd.parent_indent + int(digit) if digit
                  else len(first) - len(first.lstrip(" ")))
        old = cmd.value.splitlines()
        edits = []
        for j, line in sorted(wrapped.items()):
            n = header + 1 + j
            if n >= self.tx.lines or self.tx.line(n)[indent:] != old[j]:
                return None  # not one for one after all: write it anew
            edits.append(Edit(self.tx.starts[n] + indent, self.tx.line_end(n), line))
        return edits


def _replace_lines(value: str, wrapped: dict[int, str]) -> str:
    """``value`` with lines replaced, each keeping its own line break."""
    parts = value.splitlines(keepends=True)
    for j, line in wrapped.items():
        body = parts[j].splitlines()[0]
        parts[j] = line + parts[j][len(body):]
    return "".join(parts)


def _scalar_end(tx: _Text, cmd: _Cmd) -> int:
    """The end offset of the command scalar at cmd.start, in any style."""
    text, start = tx.text, cmd.start
    if text[start] in "'\"":
        return _skip_quoted(text, start)
    if cmd.flow:  # a plain scalar in [...] or {...} ends at an indicator or a comment
        stop = re.compile(r"[,\]}]|\s#").search(text, start)
        end = len(text)
    else:  # its lines are those indented deeper than its key or dash
        end = tx.line_end(tx.block_end(tx.line_of(start), cmd.parent_indent))
        if text[start] in "|>":
            return end
        stop = re.compile(r"\s#").search(text, start, end)
    end = stop.start() if stop else end
    return start + len(text[start:end].rstrip())


def _plain_ok(value: str, flow: bool) -> bool:
    """``value`` reads back as itself written plain, here."""
    from ruamel.yaml import YAMLError

    doc = f"{{k: {value}}}" if flow else f"k: {value}"
    try:
        return _load(doc, "", typ="safe") == {"k": value}
    except (MigrateError, YAMLError):
        return False


def _emit(value: str, style: str, flow: bool) -> str:
    """``value`` as a one-line YAML scalar, in the original's style where it can be."""
    if style == "'" and "\n" not in value:
        return "'" + value.replace("'", "''") + "'"
    if style == "plain" and "\n" not in value and _plain_ok(value, flow):
        return value
    return json.dumps(value, ensure_ascii=False)  # JSON strings are YAML double-quoted ones


# --------------------------------------------------------------------------
# plan, rewrite
# --------------------------------------------------------------------------


def plan(text: str, files: Optional[Reader] = None, name: str = "dvc.yaml") -> list[Change]:
    """What the dvc.yaml ``text`` needs for its checkpoint stages to resume
    under DVC 3. ``files`` reads the scripts a stage runs (paths relative to
    the dvc.yaml's directory; see disk_reader); without it no command is
    wrapped. ``name`` is the file's name in messages."""
    return _Planner(text, files or _no_files, name).changes()


def _apply(text: str, edits: list[Edit]) -> str:
    # Stable sort, applied from the end: inserts at one offset keep plan order.
    ordered = sorted(edits, key=lambda e: e.start)
    for before, after in zip(ordered, ordered[1:]):
        if before.end > after.start:
            raise MigrateError("overlapping edits")  # one edit per node: cannot happen
    for edit in reversed(ordered):
        text = text[:edit.start] + edit.text + text[edit.end:]
    return text


def _set(data: Any, path: tuple, value: Any) -> None:
    for key in path[:-1]:
        data = data[key]
    data[path[-1]] = value


def rewrite(text: str, files: Optional[Reader] = None, name: str = "dvc.yaml") -> str:
    """``text`` with plan()'s changes made, comments and formatting kept;
    ``text`` itself when nothing is needed."""
    changes = plan(text, files, name)
    if not changes:
        return text
    expected = copy.deepcopy(_load(text, name, typ="safe"))
    for change in changes:
        _set(expected, change.path, change.new)
    try:
        # dict.fromkeys: outputs shared through a YAML alias are edited once
        result = _apply(text, list(dict.fromkeys(e for c in changes for e in c.edits)))
        ok = _load(result, name, typ="safe") == expected and not plan(result, files, name)
    except MigrateError:
        ok = False
    if not ok:  # a layout the text edits do not cover: say what to do by hand
        raise MigrateError(f"{name}: cannot make these changes keeping the file's layout; make "
                           "them by hand:\n" + "\n".join(f"  {c}" for c in changes))
    return result


# --------------------------------------------------------------------------
# files: main, check_project
# --------------------------------------------------------------------------


def _read(file: Path) -> str:
    try:
        with open(file, encoding="utf-8", newline="") as fh:  # newline="": keep CRLF as is
            return fh.read()
    except FileNotFoundError:
        raise MigrateError(f"{file}: no such file. Run `dvc-dali migrate` where dvc.yaml is, "
                           "or pass its path") from None
    except UnicodeDecodeError as exc:
        raise MigrateError(f"{file}: not UTF-8 text ({exc.reason} at byte {exc.start}); save "
                           "it as UTF-8") from None
    except OSError as exc:
        raise MigrateError(f"{file}: cannot read it ({exc.strerror or exc})") from None


def _write_atomic(file: Path, text: str) -> None:
    """Replace ``file`` whole: a crash leaves the old or the new, never half (a
    symlinked dvc.yaml: written where it points, its permissions kept)."""
    try:
        atomic_file.replace_durable(file, text, edit=True)
    except OSError as exc:
        target = Path(os.path.realpath(file))
        raise MigrateError(f"{file}: cannot write it ({exc.strerror or exc}); it is unchanged. "
                           f"Make {target.parent} writable, then run `dvc-dali migrate` "
                           "again") from None


def _nothing_to_do(file: Path, text: str) -> str:
    stages = checkpoint_stages(text, str(file))
    if not stages:
        return (f"{file}: no stage has a `checkpoint: true` output; nothing to migrate "
                "(dvc-dali records outputs declared `persist: true` too)")
    return (f"{file}: nothing to migrate; stage(s) {', '.join(stages)} already resume "
            "under DVC 3")


def _migrate(file: Path, check: bool) -> int:
    if file.is_dir():
        file = file / "dvc.yaml"
    text = _read(file)
    files = disk_reader(file.parent)
    changes = plan(text, files, str(file))
    if not changes:
        print(_nothing_to_do(file, text))
        return 0
    shown = shlex.quote(str(file))  # the commands said are pasted into a shell
    if check:
        for change in changes:
            print(f"{file}: needs {change}")
        print(f"run `dvc-dali migrate {shown}` to make {'them' if len(changes) > 1 else 'it'}")
        return 1
    _write_atomic(file, rewrite(text, files, str(file)))
    for change in changes:
        print(f"{file}: {change}")
    print(f"review with `git diff {shown}`, then commit it before `dvc exp run` "
          f"(`git commit {shown} -m 'Migrate checkpoint stages to DVC 3'`)")
    return 0


def main(path: str = "dvc.yaml", check: bool = False) -> int:
    """`dvc-dali migrate [path] [--check]`: the exit status. With ``check`` only
    report (1 when changes are needed, 0 when none); else rewrite the file."""
    try:
        return _migrate(Path(path), check)
    except MigrateError as exc:
        print(f"dvc-dali migrate: {exc}", file=sys.stderr)
        return 1


def _dvc_yamls(root: Path) -> list[str]:
    """Every dvc.yaml under ``root`` (relative paths): git's list of tracked and
    untracked files, else a walk that skips .git and .dvc."""
    try:
        proc = gitcmd.run(["ls-files", "-z", "-co", "--exclude-standard", "--", "*dvc.yaml"],
                          str(root), check=False, text=False)
    except OSError:  # no git
        proc = None
    if proc is not None and proc.returncode == 0:  # else no git, or not a git repository
        listed = proc.stdout.decode("utf-8", errors="replace").split("\0")
        return sorted({p for p in listed
                       if posixpath.basename(p) == "dvc.yaml" and (root / p).is_file()})
    found = []
    for top, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in (".git", ".dvc")]
        if "dvc.yaml" in names:
            found.append(os.path.relpath(os.path.join(top, "dvc.yaml"), root))
    return sorted(found)


def check_project(root: str | os.PathLike) -> list[str]:
    """For `dvc-dali doctor`: one line per stage under ``root`` that DVC 3
    would not resume, naming it and the command that fixes it."""
    root = Path(root)
    lines = []
    for rel in _dvc_yamls(root):
        file = root / rel
        try:
            changes = plan(_read(file), disk_reader(file.parent), rel)
        except MigrateError as exc:
            lines.append(str(exc))
            continue
        by_stage: dict[str, list[str]] = {}
        for change in changes:
            by_stage.setdefault(change.stage, []).append(change.adds)
        for stage, adds in by_stage.items():
            lines.append(f"{rel}: stage '{stage}' will not resume under DVC 3: it needs "
                         f"{'; '.join(adds)}. Fix: `dvc-dali migrate {rel}`")
    return lines


# --------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------


def run_args(args: argparse.Namespace) -> int:
    """The `migrate` subcommand's func: argparse args in, exit status out."""
    return main(args.file, args.check)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `migrate` on an argparse subparsers object."""
    p = subparsers.add_parser(
        "migrate", help="make DVC 2 checkpoint stages resume under DVC 3",
        description="Make every stage with a `checkpoint: true` output resume under DVC 3: "
        "add `persist: true` to the output and `always_changed: true` to the stage, and "
        "wrap in `dvc-dali run` a command whose script trains only when DVC_CHECKPOINT is "
        "set. Comments and formatting are kept; running it again changes nothing.")
    p.add_argument("file", nargs="?", default="dvc.yaml",
                   help="the dvc.yaml to migrate, or a directory holding one "
                        "(default: dvc.yaml)")
    p.add_argument("--check", action="store_true",
                   help="only list the changes needed; exit 1 when there are any, 0 when none")
    p.set_defaults(func=run_args)
    return p


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(prog="dvc-dali")
    add_parser(_parser.add_subparsers(dest="cmd", required=True))
    _args = _parser.parse_args(["migrate", *sys.argv[1:]])
    sys.exit(_args.func(_args))
