"""The README's sample output is what the command prints today: it once showed a value and a source
line that had drifted (`-0.594798` and `backend.py:236` where the run printed `-1.17129` and `:237`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
INTRO = "`python -m harness run --device cpu --mutant\nsnapshot_skipped` prints today:\n\n```\n"
COMMAND = ["run", "--device", "cpu", "--mutant", "snapshot_skipped"]
# what differs from run to run: wall times, rates, and the shares of the time line
VARYING = [(re.compile(r"\d+\.\d+s\b"), "<s>"), (re.compile(r"\(\d+(\.\d+)? cases/s\)"), "(<rate> cases/s)"),
           (re.compile(r"^  time: .*$", re.MULTILINE), "  time: <shares>")]


def normalised(text: str) -> str:
    for pattern, placeholder in VARYING:
        text = pattern.sub(placeholder, text)
    return text


def readme_sample() -> str:
    readme = (PROJECT / "README.md").read_text()
    assert INTRO in readme, "the README no longer introduces its sample output as this test expects"
    start = readme.index(INTRO) + len(INTRO)
    return readme[start:readme.index("```", start)]


def test_the_readmes_sample_output_is_what_the_command_prints(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "harness", *COMMAND], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    assert normalised(done.stdout) == normalised(readme_sample())
