"""Provisioning real sshd nodes from a plan: offline hash-locked env, agent, weights."""

import json
import subprocess

import pytest
from click.testing import CliRunner

from orchestrator.cli import main
from orchestrator.errors import ConfigError
from orchestrator.store import open_store
from orchestrator.sweep.plan import load_plan


def write_plan(tmp_path, model_pair, python="3.11", extra=""):
    p = tmp_path / "plan.yml"
    p.write_text(f"""# provisioning test plan
environment:
  python: "{python}"
  packages: ["mlx==0.32.4", "mlx-lm==0.32.2"]
models:
  target: {model_pair / 'target'}
  draft: {model_pair / 'draft'}
{extra}""")
    return p


def provision(fleet, tmp_path, plan, *extra):
    inv = tmp_path / "hosts.yml"
    # a root of its own: other tests' sweeps push agents into the default ~/.specfleet
    inv.write_text(fleet.inventory_yaml().replace(
        "  vars:\n", "  vars:\n    specfleet_base_python: /usr/bin/python3\n"
                      "    specfleet_root: ~/.sf-provision\n"))
    return CliRunner().invoke(main, [
        "provision", str(plan), "-i", str(inv), "--known-hosts", str(fleet.known_hosts),
        "--db", f"sqlite:///{tmp_path / 's.db'}", "--failed-hosts-file",
        str(tmp_path / "retry"), "--json", *extra])


@pytest.fixture(scope="module")
def provisioned(fleet, model_pair, tmp_path_factory):
    d = tmp_path_factory.mktemp("prov")
    plan = write_plan(d, model_pair)
    first = provision(fleet, d, plan)
    second = provision(fleet, d, plan)
    return d, first, second


def test_first_provision_installs_env_agent_and_weights(provisioned, fleet):
    d, first, _ = provisioned
    assert first.exit_code == 0, first.output
    out = {o["host"]: o for o in json.loads(first.stdout)["outcomes"]}
    for n in fleet.nodes:
        v = out[n.name]["value"]
        assert v["env"] == "created" and v["agent"] == "pushed"
        assert v["versions"]["mlx"] == "0.32.4" and v["versions"]["mlx-lm"] == "0.32.2"
        assert v["weights_sent_bytes"] > 0
        env = n.home / ".sf-provision" / "envs" / v["env_id"]
        assert (env / ".complete").exists()
        # the env was installed from pushed wheels only: pip reports no index was used
        frozen = subprocess.run(["su", "-s", "/bin/sh", n.user, "-c",
                                 f"{env}/bin/python -m pip freeze"], capture_output=True,
                                text=True).stdout
        assert "mlx-lm==0.32.2" in frozen and "mlx-cpu==0.32.4" in frozen
    ids = {out[n.name]["value"]["env_id"] for n in fleet.nodes}
    assert len(ids) == 1  # same platform, same lock, same env id


def test_second_provision_reuses_everything(provisioned, fleet):
    d, first, second = provisioned
    assert second.exit_code == 0, second.output
    for o in json.loads(second.stdout)["outcomes"]:
        v = o["value"]
        assert v["env"] == "reused" and v["env_seconds"] < 1.0
        assert v["agent"] == "present" and v["weights_sent_bytes"] == 0
        assert v["wheels_sent_bytes"] == 0
    rows = open_store(f"sqlite:///{d / 's.db'}").engine.connect().exec_driver_sql(
        "select node, status, env_id from provision_runs").all()
    assert len(rows) == 4 and {r[1] for r in rows} == {"ok"}


def test_a_flipped_byte_with_its_mtime_restored_is_found_and_re_sent(provisioned, fleet,
                                                                      model_pair):
    """The node's blob check keys on inode and ctime too (utime cannot restore ctime): the
    next provision re-hashes the blob, reports it corrupt, re-sends it, and the agent then
    sees the right fingerprint."""
    import hashlib
    import os

    d, first, _ = provisioned
    weights = model_pair / "target" / "model.safetensors"
    sha = hashlib.sha256(weights.read_bytes()).hexdigest()
    n = fleet.nodes[0]
    blob = n.home / ".sf-provision" / "blobs" / sha
    st = blob.stat()
    with open(blob, "r+b") as f:
        f.seek(st.st_size // 2)
        b = f.read(1)
        f.seek(st.st_size // 2)
        f.write(bytes([b[0] ^ 0x01]))
    os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert blob.stat().st_mtime_ns == st.st_mtime_ns and blob.stat().st_size == st.st_size
    again = provision(fleet, d, write_plan(d, model_pair))
    assert again.exit_code == 0, again.output
    out = {o["host"]: o["value"] for o in json.loads(again.stdout)["outcomes"]}
    assert out[n.name]["weights_resent_corrupt"] == 1
    assert out[n.name]["weights_sent_bytes"] == st.st_size
    assert out[fleet.nodes[1].name]["weights_resent_corrupt"] == 0
    assert hashlib.sha256(blob.read_bytes()).hexdigest() == sha


def test_python_mismatch_is_a_failed_host_with_advice(fleet, model_pair, tmp_path):
    plan = write_plan(tmp_path, model_pair, python="3.12")
    # a lock of no platforms: the node's Python is judged before any wheel is looked for,
    # and locking 3.12's wheels for every platform downloaded ~300 MB (160 s on a fresh
    # cache) that this check never reaches
    plan.write_text(plan.read_text().replace('  packages:', '  platforms: []\n  packages:'))
    r = provision(fleet, tmp_path, plan, "--limit", "node1")
    assert r.exit_code == 1
    o = json.loads(r.stdout)["outcomes"][0]
    assert o["status"] == "failed"
    assert "runs Python 3.11.2 but the plan pins 3.12; set specfleet_base_python" in o["detail"]


def test_plan_errors_name_file_and_line(tmp_path, model_pair):
    p = write_plan(tmp_path, model_pair)
    p.write_text(p.read_text().replace("models:\n", "models:\n  verify: weekly\n"))
    with pytest.raises(ConfigError, match=r"plan.yml:6: models.verify: 'weekly' is not one "
                                          r"of always, daily, never"):
        load_plan(p)
    p = write_plan(tmp_path, model_pair, extra="sweeps: {}\n")
    with pytest.raises(ConfigError, match=r"plan.yml:8: plan: unknown key 'sweeps'"):
        load_plan(p)
    p.write_text("environment:\n  python: 3\n  packages: [mlx]\nmodels: {}\n")
    with pytest.raises(ConfigError, match=r"plan.yml:2: environment.python: expected a "
                                          r"string, got int 3"):
        load_plan(p)
    p.write_text("environment:\n  python: '3.11'\n  packages: [mlx==1]\n"
                 "models: {target: a, draft: b}\nsweep:\n  repetitions: three\n")
    with pytest.raises(ConfigError, match=r"plan.yml:6: sweep.repetitions: expected an "
                                          r"integer, got str 'three'"):
        load_plan(p)


def test_the_provision_help_example_runs_as_written(provisioned, fleet, tmp_path):
    """`specfleet provision --help`'s example, in the folder whose plan the fixture locked
    (plan.lock.json), with a newcomer's home holding ~/fleet/hosts.yml and the node's host
    key: the nodes are ready already, so it reuses the env and sends nothing."""
    import shutil

    from orchestrator.fleet.blobs import CONTROLLER_CACHE
    from tests.test_docs import Session, help_examples

    d, first, _ = provisioned
    assert first.exit_code == 0 and (d / "plan.lock.json").is_file()
    (example,) = [x for name, x in help_examples() if name == "provision"]
    s = Session(tmp_path)
    s.cwd = d
    (s.home / "fleet").mkdir()
    (s.home / "fleet" / "hosts.yml").write_text(fleet.inventory_yaml().replace(
        "  vars:\n", "  vars:\n    specfleet_base_python: /usr/bin/python3\n"
                     "    specfleet_root: ~/.sf-provision\n"))
    (s.home / ".ssh").mkdir()
    shutil.copy(fleet.known_hosts, s.home / ".ssh" / "known_hosts")
    s.env["SPECFLEET_CACHE"] = str(CONTROLLER_CACHE)  # the wheelhouse the fixture made
    r = s.run(example)
    assert r is not None and "reused" in r.stdout and r.stdout.count(" ok ") == 2, r.stdout
