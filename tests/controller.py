"""Run the controller as a separate process, as users do, so tests can kill it."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import func, select

from orchestrator.store import open_store
from orchestrator.store.models import Event, Measurement

ROOT = Path(__file__).resolve().parents[1]


def specfleet(*args: str, log: Path) -> subprocess.Popen:
    out = open(log, "ab")
    return subprocess.Popen([sys.executable, "-c", "from orchestrator.cli import main; main()",
                             *args], cwd=ROOT, stdout=out, stderr=out)


def sweep_id_from(log: Path, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(r"sweep (\w{12}) started", log.read_text(errors="replace"))
        if m:
            return m.group(1)
        time.sleep(0.1)
    raise AssertionError(f"no sweep id in {log}:\n{log.read_text()[-3000:]}")


def wait_for(pred, timeout: float = 120, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def stored_generations(url: str, sweep_id: str, node: str) -> int:
    with open_store(url, migrate=False).engine.connect() as c:
        return c.scalar(select(func.count()).select_from(Measurement).where(
            Measurement.sweep_id == sweep_id, Measurement.node == node))


def stored_events(url: str, sweep_id: str, node: str) -> list[dict]:
    with open_store(url, migrate=False).engine.connect() as c:
        return list(c.execute(select(Event.payload).where(
            Event.sweep_id == sweep_id, Event.node == node).order_by(Event.seq)).scalars())


def journal_path(node, sweep_id: str) -> Path:
    return node.home / ".specfleet" / "jobs" / f"{sweep_id}.events.jsonl"


def journal(node, sweep_id: str) -> list[dict]:
    return [json.loads(x) for x in journal_path(node, sweep_id).read_text().splitlines()]


def journaled_generations(node, sweep_id: str) -> int:
    """Generations in the node's journal so far (0 before it exists); a line still being
    written is not parsed, only counted once complete enough to name its type."""
    try:
        return journal_path(node, sweep_id).read_text().count('"type":"generation"')
    except FileNotFoundError:
        return 0


AGENT = "agent run"  # what an agent's command line holds, for pkill/pgrep -f


def signal_agents(node, sig: int) -> bool:
    """Send ``sig`` to the node user's agents; False when there was none."""
    name = signal.Signals(sig).name.removeprefix("SIG")
    return subprocess.run(["pkill", f"-{name}", "-u", node.user, "-f", AGENT],
                          check=False).returncode == 0


def kill_agent(node) -> None:
    assert signal_agents(node, signal.SIGKILL), f"no agent of {node.user} to kill"


def kill_link(node) -> None:
    """Drop the node's SSH sessions (the sshd processes), not its detached agent."""
    r = subprocess.run(["pkill", "-KILL", "-f", f"sshd: {node.user}"], check=False)
    assert r.returncode == 0, f"no ssh session of {node.user} to kill"


def hold_agents(nodes, sig: int = signal.SIGSTOP) -> None:
    """Pause (SIGSTOP) or release (SIGCONT) the nodes' agents: a test orders its faults
    while every agent still has work left, whatever the machine's speed."""
    for node in nodes:
        signal_agents(node, sig)


def agent_running(node) -> bool:
    return subprocess.run(["pgrep", "-u", node.user, "-f", AGENT],
                          capture_output=True).returncode == 0


def json_from_log(text: str) -> dict:
    """The --json document in a log that also holds progress lines."""
    return json.JSONDecoder().raw_decode(text[text.index("{\n"):])[0]


def hold_sweep(sweep_id: str, sig: int = signal.SIGSTOP) -> bool:
    """Pause (SIGSTOP) or release (SIGCONT) the agents of one sweep, whoever runs them (the
    job file's name carries the sweep id); False when none ran."""
    name = signal.Signals(sig).name.removeprefix("SIG")
    return subprocess.run(["pkill", f"-{name}", "-f", f"{AGENT} .*/{sweep_id}\\.json"],
                          check=False).returncode == 0


def signal_mid_sweep(ctl: subprocess.Popen, journal_file: Path, sweep_id: str,
                     sig: int = signal.SIGINT, timeout: float = 60) -> tuple[int, float]:
    """Send ``sig`` to the controller while its sweep cannot end: once the node journaled a
    generation, its agents are held (SIGSTOP) for the signal and released after, so a fast
    sweep never finishes first (the test would see exit 0). Returns (exit status, seconds
    from the signal to the exit)."""
    wait_for(lambda: journal_file.is_file()
             and '"type":"generation"' in journal_file.read_text(errors="replace"),
             what=f"a generation in {journal_file}")
    assert hold_sweep(sweep_id), f"no agent of sweep {sweep_id} to hold"
    try:
        assert '"type":"job_finished"' not in journal_file.read_text(errors="replace"), \
            "the sweep ended before its agent was held: plan more generations"
        t0 = time.monotonic()
        ctl.send_signal(sig)
        status = ctl.wait(timeout)
        return status, time.monotonic() - t0
    finally:
        hold_sweep(sweep_id, signal.SIGCONT)
