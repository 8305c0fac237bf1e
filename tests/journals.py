"""A real journal as test data: one small sweep of the demo pair, recorded once by the agent.

``python -m tests.journals`` records it again (a few seconds: two workloads, widths 2 and 3,
two repetitions, 16 tokens) into ``tests/data/journals/small-sweep.jsonl``, with the job it
ran. Tests that mutate journals (``test_hostile_lines``) start from these real lines, not
from lines written by hand.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "journals"
SMALL = DATA / "small-sweep.jsonl"


def lines(path: Path = SMALL) -> list[str]:
    """The journal's lines, without their newlines."""
    return path.read_text().splitlines()


def record(out: Path = SMALL) -> None:
    from orchestrator.sweep.jobspec import build_job

    job = build_job(ROOT / "orchestrator" / "demo_models" / "pair", ["code", "memo"], max_tokens=16,
                    draft_widths=[2, 3], repetitions=2)
    job["job_id"] = "recorded"
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "job.json").write_text(json.dumps(job))
        subprocess.run([sys.executable, "-m", "agent", "run", f"{d}/job.json", "--journal",
                        f"{d}/j.jsonl", "--quiet", "--lock", f"{d}/lock", "--cache-dir",
                        f"{d}/cache"], check=True, cwd=ROOT)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text((Path(d) / "j.jsonl").read_text())
    job.pop("workloads", None)  # prompts are in the plan lock; the journal names them
    out.with_suffix(".job.json").write_text(json.dumps(job, indent=1) + "\n")


if __name__ == "__main__":
    record()
    print(f"{SMALL}: {len(lines())} events")
