"""The progress printer: one line per event worth showing, as a sweep goes."""

from __future__ import annotations

import sys

from ..store.db import result_pair


def pair_label(event: dict) -> str:
    """ " target+draft-2" for a lineup's result (which pair), "" for a plan of one pair."""
    pair = result_pair(event)
    if pair and pair.endswith("+None"):  # a target's own baseline (its quality tasks)
        return f" {pair.removesuffix('+None')} alone"
    return f" {pair}" if pair else ""


def _generation(event: dict, total) -> str:
    acc = event.get("acceptance_rate")
    where = (f"{event.get('runtime')}/{event['variant']}" if event.get("variant")
             else f"k={event['num_draft_tokens']}") + pair_label(event)
    return (f"{event['run_index'] + 1:>3}/{total} "
            f"{event['workload']:<8} {event['mode']:<11} {where} "
            f"{event.get('decode_tok_s') or 0:7.1f} tok/s"
            + (f"  acceptance {acc:.2f}" if acc is not None else "")
            + ("  streaming parity MISMATCH" if event.get("parity") == "mismatch" else ""))


def _generation_failed(event: dict) -> str:
    what = event.get("variant") or event.get("workload") or "?"
    return f"generation FAILED ({what}): {str(event.get('error'))[:200]}"


def _quality(event: dict) -> str:
    return (f"quality {event['mode']} k={event['num_draft_tokens']}{pair_label(event)}: "
            f"{event['passed']}/{event['tasks']} tasks passed")


def _soak_sample(event: dict) -> str:
    return (f"soak {event['elapsed_s']:6.0f}s #{event['index'] + 1:<5} "
            f"{event.get('decode_tok_s') or 0:7.1f} tok/s  rss "
            f"{(event.get('rss_bytes') or 0) / 2**20:.0f} MiB  swap "
            f"{(event.get('swap_used_bytes') or 0) / 2**20:.0f} MiB")


def _soak_result(event: dict) -> str:
    return (f"soak {event['status']}: {event['generations']} generations in "
            f"{event.get('duration_s') or 0:.0f}s, peak rss "
            f"{(event.get('peak_rss_bytes') or 0) / 2**20:.0f} MiB"
            + "".join(f"; {r}" for r in event.get("reasons") or []))


def _load_level(event: dict) -> str:
    if event["status"] == "failed":
        told = f"FAILED: {str(event.get('error'))[:200]}"
    else:
        told = (f"{event.get('output_tok_s_total') or 0:.1f} tok/s, e2e p95 "
                f"{event.get('e2e_ms_p95') or 0:.0f} ms, {event.get('completed')}/"
                f"{event.get('requests')} ok"
                + (f", goodput {event['goodput_rps']:.2f}/s"
                   if event.get("goodput_rps") is not None else "")
                + (f"; SATURATED: {event.get('stop_reason')}"
                   if event["status"] == "saturated" else ""))
    return f"load {event['load']}={event['level']:g} {event['variant']}: " + told


# the events shown the same way whatever came before them
_STATELESS = {"generation_failed": _generation_failed, "quality": _quality,
              "soak_result": _soak_result, "load_level": _load_level,
              "job_failed": lambda e: f"agent failed: {e['message']}",
              "follow": lambda e: e["message"]}


class StderrProgress:
    """One line per event worth showing: runs done / total, config, tok/s, acceptance."""

    def __init__(self, stream=None):
        # resolved now, not at import: the CLI (or a test runner) may have replaced stderr
        self.stream, self.total, self.soak_shown = stream or sys.stderr, {}, {}

    def line(self, node: str, event: dict) -> str | None:
        """The line ``event`` of ``node`` shows, or None when it shows none."""
        kind = event["type"]
        if kind == "plan":
            self.total[node] = event["total_generations"]
            return f"{event['total_generations']} generations planned"
        if kind == "generation":
            return _generation(event, self.total.get(node, "?"))
        if kind == "soak_sample":
            # one line per ~10 s: a long soak makes a sample every generation
            if event["index"] and event["elapsed_s"] - self.soak_shown.get(node, 0) < 10:
                return None
            self.soak_shown[node] = event["elapsed_s"]
            return _soak_sample(event)
        if kind == "notice" and event.get("adaptive"):
            return _stop_line(str(event.get("message")))[:300]
        told = _STATELESS.get(kind)
        return told(event) if told else None

    def __call__(self, node: str, event: dict) -> None:
        line = self.line(node, event)
        if line is not None:
            print(f"[{node}] {line}", file=self.stream, flush=True)


def _stop_line(message: str) -> str:
    """An adaptive stop as the pages say it: "adaptive: draft width 1 stops repeating: …",
    not the journal's "num_draft_tokens=1" (any other notice as written)."""
    from agent.protocol import STOP_PREFIX, knob_words, stop_message, stop_parts

    parts = stop_parts(message)
    if parts is None or not message.startswith(STOP_PREFIX):
        return message
    return stop_message(knob_words(parts[0]), parts[1])
