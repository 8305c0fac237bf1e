"""``specfleet init DIR``: an inventory, a plan for the demo pair, and how to go on."""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

from agent.protocol import DEFAULT_SWEEP

from .errors import SpecfleetError

HOSTS = """\
# specfleet inventory (Ansible YAML; INI and host_vars/ group_vars/ folders work too).
# `local` is this machine, reached without SSH. Add Macs under `lab` with their
# address, user and key; their host keys must be in ~/.ssh/known_hosts (or run with
# --accept-new-host-keys once). Check with: specfleet inventory list -i {inv}
all:
  hosts:
    local:
      ansible_connection: local
      specfleet_root: {root}
  children:
    lab:
      hosts: {{}}
      # mac-studio-01:
      #   ansible_host: 10.0.4.11
      #   ansible_user: bench
      #   specfleet_chip: M2 Ultra            # when the node cannot report it
      #   specfleet_base_python: /usr/bin/python3
"""

PLAN = """\
# specfleet plan: what to measure, on what, with which gates.
# Lock it before sweeping:  specfleet plan lock {plan}
# Then run:                 specfleet sweep {lock} -i {inv} --no-provision
# (drop --no-provision and list your Macs' platforms below to install pinned envs).
name: {name}
environment:
  python: "{python}"
  packages: ["mlx=={mlx}", "mlx-lm=={mlx_lm}"]
  platforms: []          # e.g. [macos-14-arm64] to provision Macs with exact wheels
models:
  target: models/target  # built by `specfleet demo-models build models`
  draft: models/draft    # a lineup: [models/draft, models/draft-8bit, models/draft-4bit]
workloads:
  use: [code]            # a first sweep in about a minute; add memo, translation,
                         # or your own prompts: my-prompts.jsonl
  context: [short]                 # short, medium, long
  quality: false                   # true: also the JSON / tool-call task set per config
                                   # (for real models: the demo pair passes none)
sweep:
  base: {{temperature: 0.0}}
  knobs: {{num_draft_tokens: {widths}}}
  repetitions: 3
gates:
  min_speedup: 1.16
  acceptance_floor: 0.55
  ttft_regression_limit: 0.08
# nodes: every host of the inventory you sweep with (-i); to narrow it:
#   nodes: {{limit: mac-a}}   or   nodes: {{labels: [m4]}}
"""


def init_project(folder: Path, *, with_models: bool = True, log=print) -> list[Path]:
    """Write an inventory, a plan and (unless told not to) the demo model pair, with the
    draft's 8- and 4-bit tiers (what the README's lineup example names)."""
    folder = folder.resolve()
    inv, plan = folder / "inventory" / "hosts.yml", folder / "plan.yml"
    for p in (inv, plan):
        if p.exists():
            raise SpecfleetError(f"{p} exists; init does not overwrite files")
    inv.parent.mkdir(parents=True, exist_ok=True)
    inv.write_text(HOSTS.format(inv=inv, root=folder / ".node"))
    plan.write_text(PLAN.format(plan=plan, lock=plan.with_suffix(".lock.json"), inv=inv,
                                name=folder.name,
                                python=f"{sys.version_info.major}.{sys.version_info.minor}",
                                mlx=metadata.version("mlx"), mlx_lm=metadata.version("mlx-lm"),
                                widths=DEFAULT_SWEEP["num_draft_tokens"]))
    written = [inv, plan]
    if with_models:
        from .demo import build_demo_tiers
        from .demo_models import build_demo_models

        build_demo_models(folder / "models", log=log)
        build_demo_tiers(folder / "models", log=log)
        written.append(folder / "models")
    return written
