"""The README's usage example runs as it stands (after `aiomnn models fetch`), and prints what its comments say."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from aiomnn import models

README = Path(__file__).resolve().parent.parent / "README.md"


def _usage() -> str:
    text = README.read_text()
    section = text[text.index("## Usage"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_usage_example_prints_its_comments():
    try:
        models.path("cls")
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    code = _usage()
    # What the comments say it prints: the comment after print(net.inputs), and the comment line after the second
    # print (on a machine without a GPU, where "auto" picks the CPU).
    want_inputs = re.search(r"print\(net\.inputs\)\s+# (.*)", code).group(1)
    want_run = re.search(r"print\(session\.backend_types.*\n\s+# (.*)", code).group(1)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == want_inputs
    got_backends, got_outputs = lines[1].split("] ", 1)
    want_backends, want_outputs = want_run.split("] ", 1)
    assert got_outputs == want_outputs
    if "CPU" in got_backends:  # a machine with a GPU runs it there
        assert lines[1] == want_run
