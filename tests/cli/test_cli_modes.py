"""``--mode`` takes the modes the host knows: a name nobody declared is a usage error (exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_run_with_a_mode_nobody_declared_exits_2_naming_the_closest(tmp_path: Path) -> None:
    # `datamachine run --mode nope` used to run as if the mode were chat.
    env = {key: value for key, value in os.environ.items() if not key.startswith("DATAMACHINE_")}
    env.update({"DATAMACHINE_DB": str(tmp_path / "d.db"), "DATAMACHINE_LOAD_PLUGINS": ""})
    done = subprocess.run([sys.executable, "-m", "datamachine", "run", "hi", "--mode", "chta"],
                          capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert "mode 'chta' is not a known mode" in line
    assert "did you mean 'chat'" in line
