"""`specfleet doctor`: will a sweep work on these nodes, and if not, what to do.

Per node, one line per check with its fix: SSH reachable, host key known, Python found
(and the version the plan declares), disk free for the plan's weights, power source and
Low Power Mode, another benchmark holding the node, clock skew. The readings are the
node's facts (one shell round trip, ``facts.py``) and the node's clock around it; a check
that would make a sweep fail is ``FAIL``, one that would make its numbers doubtful is
``warn``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from .fanout import Outcome
from .inventory import Host

CLOCK_SKEW_WARN_S = 2.0  # `date +%s` resolves whole seconds; more than this is real skew
DISK_MARGIN = 1 << 30    # the env, the journal and a copy in flight need room too


@dataclass(frozen=True)
class Check:
    name: str
    status: str   # ok | warn | FAIL
    detail: str
    fix: str = ""

    def line(self) -> str:
        return f"  {self.status:<5} {self.name:<10} {self.detail}" + (
            f" → {self.fix}" if self.fix else "")


async def probe(host: Host, t) -> dict:
    """The node's facts, and its clock against ours (the midpoint of the round trip)."""
    from .facts import collect

    t0 = time.time()
    facts = await collect(host, t)
    facts["clock_skew_s"] = (facts["clock_s"] - (t0 + time.time()) / 2
                             if facts.get("clock_s") else None)
    return facts


def weights_bytes(doc: dict | None) -> int:
    from agent.protocol import model_roles

    if not doc:
        return 0
    return sum(f["size"] for r in model_roles(doc["models"])
               for f in doc["models"][r]["manifest"])


def checks(host: Host, outcome: Outcome, doc: dict | None) -> list[Check]:
    """What the outcome of ``probe`` says about one node."""
    local = host.is_local
    if outcome.status != "ok":
        detail = outcome.detail or "unreachable"
        if "known_hosts" in detail or "host key" in detail:
            return [Check("ssh", "FAIL", "the node answers, but its host key is not trusted",
                          "see the host key line"),
                    Check("host key", "FAIL", detail,
                          f"check the key, then `ssh-keyscan -p {host.port or 22} "
                          f"{host.address} >> ~/.ssh/known_hosts`, or run once with "
                          "--accept-new-host-keys")]
        return [Check("ssh", "FAIL", detail,
                      f"check address, port, user and key: `ssh -p {host.port or 22} "
                      f"{host.user + '@' if host.user else ''}{host.address} true` by hand")]
    f = outcome.value or {}
    out = [Check("ssh", "ok", "local (no SSH)" if local else
                 f"reachable ({f.get('hostname') or host.address})")]
    if not local:
        out.append(Check("host key", "ok", "known"))
    out.append(_python(f, doc))
    out.append(_disk(f, doc))
    out += _power(f)
    lock = f.get("lock") or {}
    if lock.get("held"):
        holder = lock.get("holder") or {}
        job = holder.get("job_id")
        out.append(Check("busy", "FAIL", f"another benchmark holds the node (sweep "
                         f"{job or '?'}, pid {holder.get('pid', '?')}, since "
                         f"{holder.get('started', '?')})",
                         f"wait for it, or stop it: `specfleet sweep --stop {job}`" if job
                         else "wait for it to finish"))
    elif lock.get("held") is None:
        out.append(Check("busy", "warn", "could not tell whether another benchmark holds "
                         "the node", "see the python line"))
    else:
        out.append(Check("busy", "ok", "no other benchmark holds the node"))
    skew = f.get("clock_skew_s")
    if skew is None:
        out.append(Check("clock", "warn", "the node's clock could not be read"))
    elif abs(skew) > CLOCK_SKEW_WARN_S:
        out.append(Check("clock", "warn", f"{skew:+.0f} s off the controller's clock",
                         "enable time sync on the node (System Settings › General › Date & "
                         "Time, or `sudo sntp -sS time.apple.com`); event times are the "
                         "node's"))
    else:
        out.append(Check("clock", "ok", f"within {CLOCK_SKEW_WARN_S:.0f} s of the "
                                        "controller's"))
    return out


def _python(f: dict, doc: dict | None) -> Check:
    version = f.get("python_version")
    if not version:
        return Check("python", "FAIL", f"no usable Python: {f.get('python_error') or '?'}",
                     "install Python 3 on the node, or point specfleet_python at it in the "
                     "inventory")
    want = (doc or {}).get("python")
    managed = bool((doc or {}).get("platforms"))
    mm = ".".join(version.split(".")[:2])
    if want and not managed and mm != want:
        return Check("python", "FAIL", f"{f.get('python_path')} is {version}; the plan "
                     f"declares {want} and manages no environment (platforms: [])",
                     f"set specfleet_python to a Python {want} on the node")
    return Check("python", "ok", f"{f.get('python_path')} {version}"
                 + (f" (the plan declares {want})" if want else ""))


def _disk(f: dict, doc: dict | None) -> Check:
    free = f.get("disk_free_bytes")
    need = weights_bytes(doc)
    if free is None:
        return Check("disk", "warn", "free space unknown")
    text = f"{free / 2**30:.1f} GiB free"
    if need and free < need + DISK_MARGIN:
        return Check("disk", "FAIL", f"{text}; the plan's weights need {need / 2**30:.2f} GiB "
                     f"plus {DISK_MARGIN / 2**30:.0f} GiB of room",
                     "free space on the node, or move specfleet_root to a bigger volume")
    return Check("disk", "ok", text + (f" (the plan's weights: {need / 2**30:.2f} GiB)"
                                       if need else ""))


def _power(f: dict) -> list[Check]:
    out = []
    if f.get("power_source") == "battery":
        pct = f.get("battery_percent")
        out.append(Check("power", "warn", "on battery" + (f" ({pct}%)" if pct is not None
                                                          else ""),
                         "plug the node in: runs on battery are set aside as unreliable"))
    else:
        out.append(Check("power", "ok", f.get("power_source") or "no battery"))
    if f.get("low_power_mode"):
        out.append(Check("low power", "warn", "Low Power Mode is on",
                         "turn it off (`sudo pmset -a lowpowermode 0`, or `specfleet node "
                         "prepare`): its runs are set aside"))
    else:
        out.append(Check("low power", "ok", "off" if f.get("low_power_mode") is False
                         else "not reported (no such mode here)"))
    if f.get("thermal_throttled"):
        out.append(Check("thermal", "warn", "the CPU is throttled now",
                         "let it cool; throttled runs are set aside"))
    return out


def report(hosts: list[Host], outcomes: list[Outcome], doc: dict | None) -> list[dict]:
    by = {o.host: o for o in outcomes}
    return [{"node": h.name, "checks": [asdict(c) for c in checks(h, by[h.name], doc)]}
            for h in hosts]
