"""The slowest tests of one or more JUnit XML reports (pytest --junitxml), so
a CI log shows where the time goes across the parallel and the serial part:

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


if __name__ == "__main__":
    count, reports = int(sys.argv[1]), sys.argv[2:]
    print(f"== the {count} slowest tests (setup, call and teardown)")
    for seconds, name in slowest(count, reports):
        print(f"{seconds:8.1f} s  {name}")
