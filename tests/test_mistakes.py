"""A new user's mistakes with the README's commands (benchmarks/mistakes.py): each ends with the
exit code it should, a message that names the value and the fix in a few lines, no traceback,
and none of the command's processes left behind."""
from __future__ import annotations

import re

import pytest

from benchmarks.mistakes import CASES, Mistake, Scene, run

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ")  # a log line (role@host LEVEL who: ...)


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    s = Scene(tmp_path_factory.mktemp("mistakes"))
    yield s
    s.close()


def params():
    return [pytest.param(c, id=c.name.replace(" ", "-"), marks=[pytest.mark.slow] if c.slow else [])
            for c in CASES]


@pytest.mark.parametrize("case", params())
def test_a_mistake_gets_one_clear_answer_and_leaves_nothing_behind(case: Mistake, scene: Scene):
    got = run(case, scene)
    seen = f"exit {got.code}\n--- stdout\n{got.out[-3000:]}\n--- stderr\n{got.err[-3000:]}"
    if case.code is None:
        assert got.code != 0, seen
    else:
        assert got.code in (case.code if isinstance(case.code, tuple) else (case.code,)), seen
    for word in case.expect:
        assert scene.fill(word) in got.message, seen
    assert not got.traceback, seen
    said = [line for line in got.err.splitlines() if line.strip() and not LOG_LINE.match(line)]
    assert len(said) <= 3, seen  # the answer, beside the log lines a running command writes
    assert got.left == 0, seen
