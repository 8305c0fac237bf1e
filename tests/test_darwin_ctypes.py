"""The macOS readings through libSystem, checked on Linux against the published header
declarations (tests/data/macos/headers/, see SOURCES.md): a wrong ctypes signature, struct
layout or constant would misread a Mac silently, so each is compared with the header text."""

import ctypes
import re
from ctypes import POINTER, c_char_p, c_int, c_uint8, c_uint32, c_uint64, c_void_p
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.telemetry import darwin, macos

HEADERS = Path(__file__).parent / "data" / "macos" / "headers"
# C types of the declarations → what ctypes must use (sizes as on arm64/x86_64 macOS)
C_TYPES = {
    "uint32_t": c_uint32, "int": c_int, "pid_t": c_int, "const char *": c_char_p,
    "int *": POINTER(c_int), "uint64_t *": POINTER(c_uint64), "kern_return_t": c_int,
    "mach_port_t": c_uint32, "host_t": c_uint32, "host_flavor_t": c_int,
    "host_info_t": POINTER(c_int), "mach_msg_type_number_t *": POINTER(c_uint32),
    "rusage_info_t *": c_void_p,  # void **: the caller passes its struct's address
    "mach_timebase_info_t": POINTER(darwin.MachTimebaseInfo), "uint64_t": c_uint64,
    "uint8_t": c_uint8, "natural_t": c_uint32,
}


def declarations() -> dict[str, tuple[str, list[str]]]:
    """Every ``RET name(TYPE arg, ...);`` in the captured headers: name → (ret, arg types)."""
    out = {}
    for h in HEADERS.glob("*.h"):
        for ret, name, args in re.findall(r"^(?:extern\s+)?([\w ]+?)\s+(\w+)\(([^)]*)\);",
                                          h.read_text(), re.M):
            types = [] if args.strip() == "void" else [
                re.sub(r"\s*(\*?)\s*\w+$", r" \1", a.strip()).strip().replace(" *", " *")
                for a in args.split(",")]
            out[name] = (ret.strip(), [t if not t.endswith("*") else
                                       t[:-1].strip() + " *" for t in types])
    return out


def defines() -> dict[str, int]:
    return {k: int(v) for h in HEADERS.glob("*.h")
            for k, v in re.findall(r"^#define\s+(\w+)\s+(\d+)\s*$", h.read_text(), re.M)}


def struct_fields(name: str) -> list[tuple[str, str, int]]:
    text = "".join(h.read_text() for h in HEADERS.glob("*.h"))
    body = re.search(rf"struct {name} \{{(.*?)\}};", text, re.S).group(1)
    out = []
    for ctype, field, n in re.findall(r"(\w+)\s+(\w+)(?:\[(\w+)\])?;", body):
        out.append((field, ctype, defines().get(n, int(n) if n.isdigit() else 1) if n else 1))
    return out


def same_type(a, b) -> bool:
    return ctypes.sizeof(a) == ctypes.sizeof(b) and (
        a is b or getattr(a, "_type_", None) == getattr(b, "_type_", None)
        or (hasattr(a, "contents") and hasattr(b, "contents") and a._type_ is b._type_))


def test_every_signature_matches_its_header_declaration():
    decl = declarations()
    assert set(darwin.SIGNATURES) <= set(decl), set(darwin.SIGNATURES) - set(decl)
    for name, (restype, argtypes) in darwin.SIGNATURES.items():
        ret, args = decl[name]
        assert C_TYPES[ret] is restype or same_type(C_TYPES[ret], restype), name
        assert len(args) == len(argtypes), name
        for i, (c, ours) in enumerate(zip(args, argtypes)):
            want = C_TYPES[c]
            assert want is ours or same_type(want, ours), f"{name} argument {i}: {c} vs {ours}"


def test_the_check_catches_a_wrong_signature():
    """The comparison is not vacuous: a state read into 32 bits is refused."""
    assert not same_type(POINTER(c_uint64), POINTER(c_uint32))
    assert not same_type(c_int, c_uint64)


def test_struct_layouts_match_the_headers():
    for struct, ours in (("rusage_info_v2", darwin.RusageInfoV2),
                         ("host_cpu_load_info", darwin.HostCpuLoadInfo),
                         ("mach_timebase_info", darwin.MachTimebaseInfo)):
        fields = struct_fields(struct)
        assert [f for f, _, _ in fields] == [f for f, _ in ours._fields_], struct
        for (field, ctype, n), (_, ct) in zip(fields, ours._fields_):
            want = C_TYPES[ctype] * n if n > 1 else C_TYPES[ctype]
            assert ctypes.sizeof(ct) == ctypes.sizeof(want), (struct, field)
    assert ctypes.sizeof(darwin.RusageInfoV2) == 16 + 18 * 8
    assert darwin.RusageInfoV2.ri_resident_size.offset == 16 + 6 * 8  # 7th uint64 after uuid


def test_constants_and_thermal_levels_match_the_headers():
    d = defines()
    assert (d["NOTIFY_STATUS_OK"], d["RUSAGE_INFO_V2"], d["HOST_CPU_LOAD_INFO"],
            d["CPU_STATE_MAX"]) == (darwin.NOTIFY_STATUS_OK, darwin.RUSAGE_INFO_V2,
                                    darwin.HOST_CPU_LOAD_INFO, darwin.CPU_STATE_MAX)
    assert (d["CPU_STATE_USER"], d["CPU_STATE_SYSTEM"], d["CPU_STATE_IDLE"],
            d["CPU_STATE_NICE"]) == (0, 1, 2, 3) == (darwin.CPU_STATE_USER,
                                                     darwin.CPU_STATE_SYSTEM,
                                                     darwin.CPU_STATE_IDLE, darwin.CPU_STATE_NICE)
    text = (HEADERS / "OSThermalNotification.h").read_text()
    names = re.findall(r"kOSThermalPressureLevel(\w+)", text)
    assert [darwin.THERMAL_LEVELS[i] for i in range(len(names))] == [n.lower() for n in names]
    assert re.search(r'"([\w.]+)"', text).group(1).encode() == darwin.THERMAL_NOTIFY_NAME


def test_thermal_readings_known_answers():
    assert darwin.thermal_reading(0) == {"thermal_pressure": "nominal",
                                         "thermal_throttled": False}
    assert darwin.thermal_reading(2) == {"thermal_pressure": "heavy", "thermal_throttled": True}
    assert darwin.thermal_reading(None)["thermal_throttled"] is None  # not read: not clean
    assert darwin.thermal_reading(7)["thermal_throttled"] is None  # unknown value: not read
    assert macos.parse_notify_state("com.apple.system.thermalpressurelevel 1\n") == 1
    assert macos.parse_notify_state("") is None


@given(st.integers(-5, 100))
def test_a_thermal_value_is_a_known_level_or_no_reading(value):
    r = darwin.thermal_reading(value)
    assert (r["thermal_pressure"] is None) == (r["thermal_throttled"] is None)
    if r["thermal_throttled"] is not None:
        assert r["thermal_throttled"] == (r["thermal_pressure"] != "nominal"
                                          and r["thermal_pressure"] != "light")


def test_host_cpu_ticks_known_answer():
    # ticks user, system, idle, nice at 100 Hz: busy 3+1+2 = 6 s of 16 s
    assert darwin.cpu_ticks_to_seconds([300, 100, 1000, 200], 100.0) == (6.0, 16.0)


def test_apple_silicon_reads_thermal_from_notify_never_from_pmset_notes():
    """pmset -g therm on Apple silicon prints only notes: read there, it said 'not
    throttled'; the notify state is what counts (here, heavy), and with no notify state
    the reading is missing, not clean."""
    notes = (Path(__file__).parent / "data" / "macos" / "pmset_therm_apple_silicon.txt")

    def outputs(name):
        return notes.read_text() if name == "therm" else ""

    snap = macos.read(outputs, apple_silicon=True, thermal_state=lambda: 2)
    assert snap["thermal_throttled"] is True and snap["thermal_pressure"] == "heavy"
    assert macos.read(outputs, apple_silicon=True,
                      thermal_state=lambda: None)["thermal_throttled"] is None
    intel = (Path(__file__).parent / "data" / "macos" / "pmset_therm_intel_throttled.txt")
    snap = macos.read(lambda n: intel.read_text() if n == "therm" else "",
                      apple_silicon=False, thermal_state=lambda: None)
    assert snap["thermal_throttled"] is True and snap["cpu_speed_limit_pct"] == 28


@pytest.mark.skipif(darwin.libsystem() is not None, reason="on a Mac the library loads")
def test_off_macos_every_libsystem_reader_is_no_reading():
    assert darwin.thermal_state() is None and darwin.rusage(1) is None
    assert darwin.machine_cpu() is None
