"""Shared helpers for the benchmarks: temporary git/DVC projects, generated
images, subprocess runs, statistics and result rows."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
PY = sys.executable

# Variables `dvc exp run` sets for its stage: if the bench itself runs inside
# a stage they must not leak into the runs it starts.
_DVC_RUN_VARS = ("DVC_CHECKPOINT", "DVC_ROOT", "DVC_STAGE", "DVC_EXP_NAME",
                 "DVC_EXP_BASELINE_REV", "DVCLIVE_RESUME", "DVC_DALI_SIGNAL_FILE",
                 "DVC_DALI_SIGNAL_TIMEOUT", "DVC_DALI_KEEP_LAST", "DVC_DALI_KEEP_BEST",
                 "GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")


def env(extra: dict[str, str] | None = None) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k not in _DVC_RUN_VARS}
    out["PATH"] = f"{Path(PY).parent}{os.pathsep}{out.get('PATH', '')}"
    out["PYTHONPATH"] = str(REPO)  # this checkout's dvc_dali, whatever pip points at
    out["DVC_NO_ANALYTICS"] = "1"
    out.update(extra or {})
    return out


def run(cmd: list[Any], cwd: Path | str, extra_env: dict[str, str] | None = None,
        check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True,
                          env=env(extra_env), timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {proc.returncode} in {cwd}\n"
                           f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n"
                           f"{proc.stderr[-4000:]}")
    return proc


def timed_run(cmd: list[Any], cwd: Path | str, extra_env: dict[str, str] | None = None
              ) -> tuple[float, subprocess.CompletedProcess]:
    t = time.perf_counter()
    proc = run(cmd, cwd, extra_env)
    return time.perf_counter() - t, proc


DVC3 = [PY, "-m", "dvc"]


def git_init(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    run(["git", "init", "-q", "-b", "main"], path)
    for key, value in (("user.email", "bench@example.invalid"), ("user.name", "dvc-dali bench"),
                       ("commit.gpgsign", "false")):
        run(["git", "config", key, value], path)


def dvc_project(path: Path, dvc: list[Any], files: dict[str, str],
                config: dict[str, str] | None = None) -> Path:
    """A git repo with `dvc init`, the given files and one commit."""
    git_init(path)
    run([*dvc, "init", "-q"], path)
    for key, value in {"core.analytics": "false", "core.check_update": "false",
                       **(config or {})}.items():
        run([*dvc, "config", key, value], path)
    for rel, text in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)
    run(["git", "add", "-A"], path)
    run(["git", "commit", "-q", "-m", "init"], path)
    return path


def write_jpegs(root: Path, n: int, classes: int = 4, side: tuple[int, int] = (96, 128),
                seed: int = 0) -> Path:
    """n real JPEGs (smooth random images, varied sizes) in class folders."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c in range(classes):
        (root / f"class{c}").mkdir(parents=True, exist_ok=True)
    for i in range(n):
        h, w = (int(v) for v in rng.integers(side[0], side[1] + 1, 2))
        small = rng.integers(0, 256, (h // 8 + 1, w // 8 + 1, 3), dtype=np.uint8)
        img = Image.fromarray(small).resize((w, h), Image.BILINEAR)
        noise = rng.integers(-12, 13, (h, w, 3))
        pixels = np.clip(np.asarray(img, dtype=np.int16) + noise, 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="JPEG", quality=85)
        (root / f"class{i % classes}" / f"{i:06d}.jpg").write_bytes(buf.getvalue())
    return root


def read_log(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def median(xs: Iterable[float]) -> float:
    xs = list(xs)
    return statistics.median(xs) if xs else float("nan")


def fmt_s(seconds: float) -> str:
    """A duration with a unit that keeps 3 significant digits."""
    if seconds != seconds:
        return "n/a"
    if seconds < 0:
        return "-" + fmt_s(-seconds)
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} us"


class FloorWriter:
    """The floor of an asynchronous checkpoint (benchmarks 4 and 7): at each
    save, the write in flight waited for, the host copies taken, then written
    into one new file, fsynced and the previous file removed on a background
    thread. Nothing else: what any durable asynchronous save of them costs."""

    def __init__(self, directory: Path, prefix: str = "") -> None:
        from concurrent.futures import Future, ThreadPoolExecutor

        directory.mkdir(parents=True, exist_ok=True)
        self.dir, self.prefix, self.n = directory, prefix, 0
        self.pool = ThreadPoolExecutor(1)
        self.future: Future | None = None

    def save(self, take_copies: Any) -> None:
        """``take_copies()``: the arrays to write, copied (the snapshot)."""
        self.wait()
        self.n += 1
        self.future = self.pool.submit(self._write, take_copies(), self.n)

    def _write(self, copies: list, n: int) -> None:
        with open(self.dir / f"{self.prefix}{n}.bin", "wb") as fh:
            for array in copies:
                fh.write(memoryview(array).cast("B"))
            fh.flush()
            os.fsync(fh.fileno())
        (self.dir / f"{self.prefix}{n - 1}.bin").unlink(missing_ok=True)

    def wait(self) -> None:
        if self.future is not None:
            self.future.result()
        self.future = None


@dataclasses.dataclass
class Row:
    """One line of the result table."""

    bench: str
    ours: str
    reference: str
    ratio: str
    goal: str = "-"
    met: str = "n/a"  # "yes", "NO" or "n/a" (no goal: reported for information)
    values: dict[str, Any] = dataclasses.field(default_factory=dict)  # raw numbers, for --out


def yes_no(ok: bool) -> str:
    return "yes" if ok else "NO"


def say(*parts: Any) -> None:
    print(*parts, file=sys.stderr, flush=True)
