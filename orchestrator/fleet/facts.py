"""Node facts: one shell round trip per node, parsed on the controller.

macOS readings come from sw_vers, sysctl, system_profiler and pmset (parsers tested
on real captured output); Linux nodes answer the same questions from /proc, /sys and
/etc/os-release.
"""

from __future__ import annotations

import json
import re

from agent.telemetry.macos import parse_pmset_batt, parse_pmset_g, parse_pmset_therm

from .inventory import Host
from .transport import q

# One Python start per node (it costs more than every other probe together): the
# interpreter's path and version, and whether another agent holds the node lock.
PY_PROBE = r'''import sys
print(sys.executable)
print("%d.%d.%d" % sys.version_info[:3])
print("@@lock")
import fcntl, os
p = sys.argv[1]
if not os.path.exists(p):
    print("free"); sys.exit()
fd = os.open(p, os.O_RDWR)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print("free")
except BlockingIOError:
    print("held " + os.pread(fd, 4096, 0).decode(errors="replace"))'''


def facts_script(root: str, python: str) -> str:
    """The POSIX sh the node runs; every section starts with ``@@name``."""
    r, py = q(root), q(python)
    mac = ["s sw_vers; sw_vers", "s brand; sysctl -n machdep.cpu.brand_string",
           "s hw_model; sysctl -n hw.model", "s memsize; sysctl -n hw.memsize",
           "s sp_hardware; system_profiler -detailLevel mini SPHardwareDataType",
           "s sp_displays; system_profiler SPDisplaysDataType",
           "s batt; pmset -g batt", "s pmset; pmset -g", "s therm; pmset -g therm",
           "s boottime; sysctl kern.boottime"]
    linux = ["s os_release; cat /etc/os-release",
             "s cpuinfo; grep -m1 'model name' /proc/cpuinfo",
             "s nproc; getconf _NPROCESSORS_ONLN", "s meminfo; grep MemTotal /proc/meminfo",
             "s uptime; cat /proc/uptime",
             "s power_supply; for d in /sys/class/power_supply/*; do [ -e \"$d/type\" ] && "
             "echo \"$(basename \"$d\") $(cat \"$d/type\") $(cat \"$d/online\" 2>/dev/null) "
             "$(cat \"$d/status\" 2>/dev/null) $(cat \"$d/capacity\" 2>/dev/null)\"; done"]
    return "\n".join([
        "s() { echo \"@@$1\"; }", "exec 2>/dev/null",
        "s now; date +%s", "s uname; uname -srm", "s hostname; uname -n",
        "if [ \"$(uname -s)\" = Darwin ]; then", *mac, "else", *linux, "fi",
        f"s df; if [ -d {r} ]; then df -Pk {r}; else df -Pk ~; fi",
        f"s python; {py} -S -c {q(PY_PROBE)} {q(root + '/agent.lock')} 2>&1",
        "exit 0",
    ])


def sections(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    name: str | None = None
    buf: list[str] = []
    for line in text.splitlines():
        if line.startswith("@@"):
            if name:
                out[name] = "\n".join(buf).strip()
            name, buf = line[2:].strip(), []
        else:
            buf.append(line)
    if name:
        out[name] = "\n".join(buf).strip()
    return out


def parse_sw_vers(text: str) -> dict:
    kv = dict(re.findall(r"^(\w+):\s*(.+)$", text, re.M))
    return {"os_name": kv.get("ProductName"), "os_version": kv.get("ProductVersion"),
            "os_build": kv.get("BuildVersion")}


def parse_os_release(text: str) -> dict:
    kv = {k: v.strip('"') for k, v in re.findall(r"^(\w+)=(.*)$", text, re.M)}
    return {"os_name": kv.get("NAME"), "os_version": kv.get("VERSION_ID"),
            "os_build": kv.get("VERSION") or kv.get("BUILD_ID")}


def parse_sp_hardware(text: str) -> dict:
    kv = dict(re.findall(r"^\s*([^:\n]+):\s*(.+)$", text, re.M))
    mem = re.match(r"([\d.]+)\s*(GB|TB)", kv.get("Memory", ""))
    cores = re.match(r"(\d+)", kv.get("Total Number of Cores", ""))
    return {"chip": kv.get("Chip"), "hw_model": kv.get("Model Identifier"),
            "cpu_cores": int(cores.group(1)) if cores else None,
            "ram_bytes": int(float(mem.group(1)) * (2**40 if mem.group(2) == "TB" else 2**30))
            if mem else None}


def parse_gpu_cores(text: str) -> int | None:
    """GPU cores from SPDisplaysDataType (Apple silicon lists them under the chipset)."""
    m = re.search(r"Chipset Model:.*?Total Number of Cores:\s*(\d+)", text, re.S)
    return int(m.group(1)) if m else None


def parse_boottime(text: str) -> int | None:
    m = re.search(r"sec = (\d+)", text)
    return int(m.group(1)) if m else None


def parse_df(text: str) -> int | None:
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("Filesystem")]
    if not lines:
        return None
    parts = lines[-1].split()
    return int(parts[3]) * 1024 if len(parts) >= 4 and parts[3].isdigit() else None


def parse_linux_power(text: str) -> dict:
    source, pct = None, None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == "Mains" and parts[2] == "1":
            source = "ac"
        if len(parts) >= 4 and parts[1] == "Battery":
            pct = int(parts[-1]) if parts[-1].isdigit() else pct
            if "Discharging" in parts:
                source = "battery"
    return {"power_source": source, "battery_percent": pct}


def parse_lock(text: str) -> dict:
    if text.startswith("held"):
        try:
            return {"held": True, "holder": json.loads(text[5:])}
        except ValueError:
            return {"held": True, "holder": None}
    return {"held": False, "holder": None} if text == "free" else {"held": None, "holder": None}


def parse_facts(text: str, host: Host) -> dict:
    s = sections(text)
    mac = bool(s.get("sw_vers"))
    f: dict = {"hostname": s.get("hostname") or None, "kernel": s.get("uname") or None,
               "platform": "macos" if mac else "linux"}
    f.update(parse_sw_vers(s["sw_vers"]) if mac else parse_os_release(s.get("os_release", "")))
    if mac:
        f.update(parse_sp_hardware(s.get("sp_hardware", "")))
        f["chip"] = s.get("brand") or f.get("chip")
        f["hw_model"] = s.get("hw_model") or f.get("hw_model")
        if s.get("memsize", "").isdigit():
            f["ram_bytes"] = int(s["memsize"])
        f["gpu_cores"] = parse_gpu_cores(s.get("sp_displays", ""))
        batt = parse_pmset_batt(s.get("batt", ""))
        f.update(power_source=batt["power_source"], battery_percent=batt["battery_percent"])
        f.update(parse_pmset_g(s.get("pmset", "")))
        therm = parse_pmset_therm(s.get("therm", ""))
        f.update(thermal_throttled=therm["thermal_throttled"],
                 cpu_speed_limit_pct=therm["cpu_speed_limit_pct"])
        boot = parse_boottime(s.get("boottime", ""))
        now = int(s["now"]) if s.get("now", "").isdigit() else None
        f["uptime_s"] = now - boot if boot and now else None
    else:
        f["chip"] = s.get("cpuinfo", "").split(":", 1)[-1].strip() or None
        f["cpu_cores"] = int(s["nproc"]) if s.get("nproc", "").isdigit() else None
        m = re.search(r"(\d+)", s.get("meminfo", ""))
        f["ram_bytes"] = int(m.group(1)) * 1024 if m else None
        f["gpu_cores"] = None
        f.update(parse_linux_power(s.get("power_supply", "")))
        f.update(low_power_mode=None, thermal_throttled=None, cpu_speed_limit_pct=None)
        up = s.get("uptime", "").split()
        f["uptime_s"] = int(float(up[0])) if up else None
    f["chip"] = host.vars.get("specfleet_chip") or f.get("chip")
    f["disk_free_bytes"] = parse_df(s.get("df", ""))
    py = s.get("python", "").splitlines()
    ok = len(py) == 2 and re.fullmatch(r"\d+\.\d+\.\d+\S*", py[1] or "")
    f["python_path"], f["python_version"] = (py[0], py[1]) if ok else (None, None)
    f["python_error"] = None if ok else (s.get("python") or "no output")[-300:]
    f["lock"] = parse_lock(s.get("lock", ""))
    f["clock_s"] = int(s["now"]) if s.get("now", "").isdigit() else None  # for doctor
    return f


async def collect(host: Host, t) -> dict:
    from .node_paths import expand_root

    home = await t.home()
    root = expand_root(host.root, home)
    res = await t.run(facts_script(root, host.python))
    return parse_facts(res.stdout, host)
