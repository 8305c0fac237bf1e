"""macOS readings through libSystem with ctypes: no root, no command, no psutil needed.

- thermal pressure: the notify(3) state ``com.apple.system.thermalpressurelevel`` (the signal
  behind ``ProcessInfo.thermalState``); ``pmset -g therm`` prints only notes on Apple silicon,
  even while throttling, so it is read on Intel Macs only (``macos.py``);
- machine CPU time: ``host_statistics(HOST_CPU_LOAD_INFO)``, ticks per state;
- a process's CPU time and RSS: ``proc_pid_rusage(RUSAGE_INFO_V2)``, for the one process
  (a runtime's children are summed only through psutil, which every node lock carries).

Every signature is declared in ``SIGNATURES`` / ``RusageInfoV2`` / ``HostCpuLoadInfo``;
tests/test_darwin_ctypes.py checks them against the published header declarations kept in
tests/data/macos/headers/. Each reader returns None when its source is missing or fails:
a reading that could not be taken is never a clean one.
"""

from __future__ import annotations

import ctypes
import os
import sys
from ctypes import POINTER, c_char_p, c_int, c_uint8, c_uint32, c_uint64, c_void_p

LIBSYSTEM = "/usr/lib/libSystem.B.dylib"
THERMAL_NOTIFY_NAME = b"com.apple.system.thermalpressurelevel"
NOTIFY_STATUS_OK = 0
RUSAGE_INFO_V2 = 2
HOST_CPU_LOAD_INFO = 3
CPU_STATE_USER, CPU_STATE_SYSTEM, CPU_STATE_IDLE, CPU_STATE_NICE = 0, 1, 2, 3
CPU_STATE_MAX = 4
# OSThermalPressureLevel, macOS branch of the enum (0..4). The other branch (iOS: 0, 10, .., 50)
# is accepted too, so a Mac that reports it is not misread.
THERMAL_LEVELS = {0: "nominal", 1: "moderate", 2: "heavy", 3: "trapping", 4: "sleeping",
                  10: "light", 20: "moderate", 30: "heavy", 40: "trapping", 50: "sleeping"}
THROTTLING = {"moderate", "heavy", "trapping", "sleeping"}  # the OS slows the CPU/GPU


class RusageInfoV2(ctypes.Structure):
    _fields_ = [("ri_uuid", c_uint8 * 16)] + [(name, c_uint64) for name in (
        "ri_user_time", "ri_system_time", "ri_pkg_idle_wkups", "ri_interrupt_wkups",
        "ri_pageins", "ri_wired_size", "ri_resident_size", "ri_phys_footprint",
        "ri_proc_start_abstime", "ri_proc_exit_abstime", "ri_child_user_time",
        "ri_child_system_time", "ri_child_pkg_idle_wkups", "ri_child_interrupt_wkups",
        "ri_child_pageins", "ri_child_elapsed_abstime", "ri_diskio_bytesread",
        "ri_diskio_byteswritten")]


class HostCpuLoadInfo(ctypes.Structure):
    _fields_ = [("cpu_ticks", c_uint32 * CPU_STATE_MAX)]  # natural_t


class MachTimebaseInfo(ctypes.Structure):
    _fields_ = [("numer", c_uint32), ("denom", c_uint32)]


# name -> (restype, argtypes); kern_return_t is int, mach_port_t/host_t are 32-bit ports
SIGNATURES: dict[str, tuple] = {
    "notify_register_check": (c_uint32, [c_char_p, POINTER(c_int)]),
    "notify_get_state": (c_uint32, [c_int, POINTER(c_uint64)]),
    "notify_cancel": (c_uint32, [c_int]),
    "proc_pid_rusage": (c_int, [c_int, c_int, c_void_p]),
    "mach_host_self": (c_uint32, []),
    "host_statistics": (c_int, [c_uint32, c_int, POINTER(c_int), POINTER(c_uint32)]),
    "mach_timebase_info": (c_int, [POINTER(MachTimebaseInfo)]),
}

_lib: ctypes.CDLL | None = None


def libsystem() -> ctypes.CDLL | None:
    """libSystem with every signature set, or None off macOS (or when it cannot load)."""
    global _lib
    if _lib is None and sys.platform == "darwin":
        try:
            lib = ctypes.CDLL(LIBSYSTEM)
            for name, (restype, argtypes) in SIGNATURES.items():
                fn = getattr(lib, name)
                fn.restype, fn.argtypes = restype, argtypes
            _lib = lib
        except (OSError, AttributeError):
            return None
    return _lib


def thermal_level_name(state: int | None) -> str | None:
    return None if state is None else THERMAL_LEVELS.get(state)


def thermal_reading(state: int | None) -> dict:
    """The notify state as sampler fields; an unknown value is no reading (not 'nominal')."""
    level = thermal_level_name(state)
    return {"thermal_pressure": level,
            "thermal_throttled": None if level is None else level in THROTTLING}


def thermal_state(lib=None) -> int | None:
    """The current thermal pressure level (register, read, cancel), or None."""
    lib = lib or libsystem()
    if lib is None:
        return None
    token = c_int(0)
    if lib.notify_register_check(THERMAL_NOTIFY_NAME, ctypes.byref(token)) != NOTIFY_STATUS_OK:
        return None
    try:
        state = c_uint64(0)
        if lib.notify_get_state(token, ctypes.byref(state)) != NOTIFY_STATUS_OK:
            return None
        return int(state.value)
    finally:
        lib.notify_cancel(token)


def _timebase(lib) -> float:
    """Nanoseconds per mach absolute-time unit (1 on Intel, 125/3 on Apple silicon)."""
    tb = MachTimebaseInfo()
    if lib.mach_timebase_info(ctypes.byref(tb)) != 0 or not tb.denom:
        return 1.0
    return tb.numer / tb.denom


def rusage(pid: int, lib=None) -> tuple[float, int] | None:
    """(CPU seconds user + system, resident bytes) of one process, or None."""
    lib = lib or libsystem()
    if lib is None:
        return None
    info = RusageInfoV2()
    if lib.proc_pid_rusage(pid, RUSAGE_INFO_V2, ctypes.byref(info)) != 0:
        return None
    ns = (info.ri_user_time + info.ri_system_time) * _timebase(lib)
    return ns / 1e9, int(info.ri_resident_size)


def cpu_ticks_to_seconds(ticks, hz: float) -> tuple[float, float]:
    """(busy, total) seconds from host_cpu_load_info's ticks (user, system, idle, nice)."""
    total = sum(ticks) / hz
    return total - ticks[CPU_STATE_IDLE] / hz, total


_HOST_PORTS: dict[object, int] = {}  # per library object (kept: one per process)


def _host_port(lib) -> int:
    """The host port, asked for once per library: each mach_host_self() call hands out one
    more send right that must be released (psutil issue 333); the sampler reads ~2 Hz."""
    port = _HOST_PORTS.get(lib)
    if port is None:
        port = _HOST_PORTS[lib] = int(lib.mach_host_self())
    return port


def machine_cpu(lib=None) -> tuple[float, float] | None:
    """(busy, total) CPU seconds of the whole machine since boot, or None."""
    lib = lib or libsystem()
    if lib is None:
        return None
    info = HostCpuLoadInfo()
    count = c_uint32(ctypes.sizeof(info) // ctypes.sizeof(c_int))
    if lib.host_statistics(_host_port(lib), HOST_CPU_LOAD_INFO,
                           ctypes.cast(ctypes.byref(info), POINTER(c_int)),
                           ctypes.byref(count)) != 0:
        return None
    try:
        hz = float(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError):
        hz = 100.0
    return cpu_ticks_to_seconds(list(info.cpu_ticks), hz)
