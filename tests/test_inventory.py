import pytest

from orchestrator.errors import ConfigError
from orchestrator.inventory import load_inventory

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def test_example_inventory_has_groups_and_vars():
    inv = load_inventory(ROOT / "inventory" / "example.yml")
    hosts = {h.name: h for h in inv.hosts}
    assert hosts["mac-mini-07"].port == 2222
    assert hosts["mac-mini-07"].user == "bench"  # inherited from all: vars
    assert hosts["mac-studio-01"].python == "/opt/specfleet/venv/bin/python"
    assert "lab" in hosts["mac-studio-01"].groups
    assert [h.name for h in inv.select("mac-mini-07")] == ["mac-mini-07"]
    assert len(inv.select("lab")) == 2


def test_local_inventory_is_one_local_node():
    inv = load_inventory(ROOT / "inventory" / "local.yml")
    assert [h.is_local for h in inv.hosts] == [True]


def test_missing_inventory_names_the_file(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_inventory(tmp_path / "nope.yml")
    assert str(e.value) == f"{tmp_path / 'nope.yml'}: file not found"


def test_malformed_yaml_names_file_and_line(tmp_path):
    p = tmp_path / "hosts.yml"
    p.write_text("all:\n  hosts:\n    a:\n      ansible_host: [1, 2\n    b: {}\n")
    with pytest.raises(ConfigError) as e:
        load_inventory(p)
    assert str(e.value).startswith(f"{p}:5: invalid YAML")


def test_unknown_specfleet_variable_names_the_line(tmp_path):
    p = tmp_path / "hosts.yml"
    p.write_text("all:\n  hosts:\n    a:\n      ansible_host: 10.0.0.1\n"
                 "      specfleet_pyhton: /usr/bin/python3\n")
    with pytest.raises(ConfigError) as e:
        load_inventory(p)
    assert str(e.value) == f"{p}:5: host a: unknown variable 'specfleet_pyhton'"


def test_bad_port_and_duplicate_key(tmp_path):
    p = tmp_path / "hosts.yml"
    p.write_text("all:\n  hosts:\n    a:\n      ansible_port: ssh\n")
    with pytest.raises(ConfigError, match=r":4: host a: ansible_port must be a port number"):
        load_inventory(p)
    p.write_text("all:\n  hosts:\n    a: {}\n    a: {}\n")
    with pytest.raises(ConfigError, match=r":4: duplicate key 'a'"):
        load_inventory(p)


def test_unknown_limit_is_an_error():
    inv = load_inventory(ROOT / "inventory" / "example.yml")
    with pytest.raises(ConfigError, match="unknown hosts or groups: nosuch"):
        inv.select("nosuch")
