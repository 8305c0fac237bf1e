"""specfleet installs like a package: a wheel built from the checkout's files, installed in a
fresh venv in a scratch folder (uv, from its cache when it can), runs outside the checkout:
init, plan lock, a sweep of this machine, review, db upgrade, inventory list, schedule
install. Templates, migrations, inventories, prompts and rules are package data; nothing of
the checkout is on the path."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
UV = Path(sys.executable).with_name("uv")


def build_wheel(tmp: Path) -> Path:
    """The wheel of the files a clone would have (tracked, and new ones not ignored)."""
    src = tmp / "src"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                           capture_output=True, check=True).stdout.split(b"\0")
    for f in filter(None, files):
        rel = Path(f.decode())
        if (ROOT / rel).is_file() and not rel.parts[0] == "tests":
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    subprocess.run([str(UV), "build", "--wheel", "--offline", "-q", "--out-dir",
                    str(tmp / "dist"), str(src)], check=True, capture_output=True)
    (wheel,) = (tmp / "dist").glob("specfleet-*.whl")
    return wheel


def test_a_built_wheel_works_outside_the_checkout(tmp_path):
    wheel = build_wheel(tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([str(UV), "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    install = [str(UV), "pip", "install", "-q", "--python", str(venv / "bin" / "python"),
               str(wheel)]
    if subprocess.run([*install, "--offline"], capture_output=True).returncode != 0:
        subprocess.run(install, check=True, capture_output=True)  # a cold cache: fetch once
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("SPECFLEET_DB",
                                                                        "PYTHONPATH"))},
           "HOME": str(home), "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}

    def run(*args: str) -> str:
        r = subprocess.run(["specfleet", *args], cwd=work, env=env, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0 and "Traceback" not in r.stderr, (args, r.stdout, r.stderr)
        return r.stdout + r.stderr

    where = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import orchestrator, agent; print(orchestrator.__file__)"],
                           cwd=work, env=env, capture_output=True, text=True).stdout
    assert where.startswith(str(venv)), where  # the wheel's copy, not the checkout's
    # plan lock fetches nodes' wheels with `python -m pip download`: pip is declared
    assert subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "--version"],
                          capture_output=True).returncode == 0
    # the demo pair ships as package data: init copies it (verified against BUILD.json)
    # instead of training for minutes
    assert "reused committed pair" in run("init", "lab/")
    installed = venv.glob("lib/python*/site-packages/orchestrator/demo_models/pair/BUILD.json")
    assert next(installed).read_text() == (
        ROOT / "orchestrator" / "demo_models" / "pair" / "BUILD.json").read_text()
    plan = work / "lab" / "plan.yml"
    # one short generation per config; about installing, not reliability: a busy host's
    # runs stay `ok`
    text = plan.read_text().replace(
        "  repetitions: 3\n",
        "  repetitions: 1\n  cv_threshold: 1.0\n  contention_threshold: 1.0\n").replace(
        "  context: [short]", "  max_tokens: 16\n  context: [short]")
    plan.write_text(re.sub(r"num_draft_tokens: \[[^\]]*\]", "num_draft_tokens: [2]", text))
    run("plan", "lock", "lab/plan.yml")
    db = f"sqlite:///{work / 'runs.db'}"
    out = run("sweep", "lab/plan.lock.json", "-i", "lab/inventory/", "--no-provision",
              "--db", db)
    assert re.search(r"sweep \w{12}: ok", out), out
    run("review", "--db", db, "--out", "review.html")
    assert "<html" in (work / "review.html").read_text()[:500].lower()
    assert "store at revision" in run("db", "upgrade", "--db", f"sqlite:///{work / 'b.db'}")
    assert re.search(r"^local\s", run("inventory", "list"), re.M)  # the packaged local.yml
    run("schedule", "install", "lab/plan.lock.json", "-i", "lab/inventory/", "--kind",
        "launchd", "--dest", "sch", "--db", db)
    assert next((work / "sch").glob("*.plist")).read_text().count("LimitLoadToSessionType")
