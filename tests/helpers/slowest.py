"""The slowest tests of one or more JUnit XML reports (pytest --junitxml), and
the slowest files (a worker runs a file whole: tests/conftest.py's
LONGEST_FIRST starts the longest first), so a CI log shows where the time
goes across the parallel and the serial part:

    python3 -m tests.helpers.slowest 30 parallel.xml serial.xml
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET


def slowest(count: int, reports: list[str]) -> list[tuple[float, str]]:
    cases = []
    for report in reports:
        for case in ET.parse(report).iter("testcase"):
            name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
            cases.append((float(case.get("time") or 0), name))
    return sorted(cases, reverse=True)[:count]


def slowest_files(count: int, reports: list[str]) -> list[tuple[float, str]]:
    files: dict[str, float] = {}
    for seconds, name in slowest(10**9, reports):
        path = name.split("::")[0]
        files[path] = files.get(path, 0.0) + seconds
    return sorted(((s, p) for p, s in files.items()), reverse=True)[:count]


if __name__ == "__main__":
    count, reports = int(sys.argv[1]), sys.argv[2:]
    print(f"== the {count} slowest tests (setup, call and teardown)")
    for seconds, name in slowest(count, reports):
        print(f"{seconds:8.1f} s  {name}")
    print(f"== the {count // 2} slowest files (their tests' times added)")
    for seconds, name in slowest_files(count // 2, reports):
        print(f"{seconds:8.1f} s  {name}")
