"""Two users' agents on one Linux host: mlx compiles its CPU kernels into
``$TMPDIR/mlx/<version>/cpu``, which the first user to run mlx creates (0755). A second
user's agent used to fail every generation whose kernel was new ("[Compile::eval_cpu]
Failed to compile function"): a fresh CI host's first run lost a whole store-outage sweep
to it, five node users at once. The agent now compiles into a folder of its own user's
(``specfleet-<uid>``, 0700)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.sweep.jobspec import build_job
from tests.blas import openblas

ROOT = Path(__file__).resolve().parents[1]
NOBODY = 65534

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="runs the agent as another user (root and util-linux setpriv on Linux)")


def test_a_second_users_agent_compiles_its_own_kernels(place, model_pair):
    # the shared temp folder (1777, as /tmp) as the first user left it: its mlx folder
    # (root's, 0755) is not ours to write
    shared = place / "shared-tmp"
    (shared / "mlx").mkdir(parents=True)
    shared.chmod(0o1777)
    (shared / "mlx").chmod(0o755)
    home = place / "home"
    home.mkdir()
    os.chown(home, NOBODY, NOBODY)
    job = build_job(model_pair, ["code"], max_tokens=8, draft_widths=[2])
    (place / "job.json").write_text(json.dumps(job))
    (place / "job.json").chmod(0o644)
    env = {**{k: v for k, v in os.environ.items() if k != "TMPDIR"}, **openblas(),
           "HOME": str(home), "TMPDIR": str(shared)}
    j = home / "events.jsonl"
    p = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
         sys.executable, "-m", "agent", "run", str(place / "job.json"), "--journal", str(j),
         "--lock", str(home / "agent.lock"), "--machine-lock", str(home / "machine.lock"),
         "--cache-dir", str(home / "cache"), "--quiet"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    events = [json.loads(x) for x in j.read_text().splitlines()] if j.exists() else []
    failed = [e.get("error") for e in events if e["type"] == "generation_failed"]
    assert p.returncode == 0 and not failed, (p.stderr[-2000:], failed)
    assert [e["mode"] for e in events if e["type"] == "generation"] == \
        ["baseline", "speculative"]
    assert list((shared / f"specfleet-{NOBODY}" / "mlx").rglob("*.so")), \
        "the kernels were compiled into the user's own folder"
    assert not list((shared / "mlx").iterdir()), "nothing written to the shared folder's mlx"
