"""The adaptive sweep inside the one loop: which planned slots are skipped once
``agent.adaptive.settle`` says their answer is known, and the notice each skip journals."""

from __future__ import annotations

import json

from .adaptive import resolved, settle
from .engine_api import Engine, Slot
from .job import Job
from .journal import Journal
from .protocol import stop_message


class Adaptive:
    """The adaptive sweep inside the one loop: candidates drop out of later repetitions
    once ``agent.adaptive.settle`` says their answer is known; each drop is journaled with
    its reason, and the slots it saves are counted, never reported as failures."""

    def __init__(self, job: Job, engine: Engine, journal: Journal):
        self.job, self.engine, self.journal = job, engine, journal
        self.spec = resolved(job.adaptive, job.repetitions)
        self.samples: dict[tuple, dict[tuple, list[float | None]]] = {}
        # each candidate's own decode rate a round: candidates compare on these (settle)
        self.rates: dict[tuple, dict[tuple, list[float | None]]] = {}
        self.widths: dict[tuple, int | None] = {}
        self.baselines: dict[tuple, dict] = {}  # the pairing's baseline, this repetition
        self.settled: dict[tuple, str] = {}
        self.round: dict[str, int] = {}
        self.skipped = 0

    def _key(self, s: Slot) -> tuple:
        knob = None if s.knob == "variant" else s.knob
        return (s.workload.name, (s.partner or s.variant).name, knob,
                json.dumps(s.knob_value if knob else None, default=str),
                json.dumps(s.fields, sort_keys=True))

    def _group(self, s: Slot) -> tuple:
        # an http runtime's variants compete with each other; in process, each pair's
        # widths among themselves (a lineup has one knee per pair)
        return (s.workload.name, None if self.engine.variants_are_configs
                else (s.partner or s.variant).name)

    def skip(self, s: Slot) -> bool:
        w = s.workload.name
        if s.repetition > self.round.get(w, 0):  # a round of this workload ended: decide
            self.round[w] = s.repetition
            for group, samples in self.samples.items():
                if group[0] != w:
                    continue
                live = {k: xs for k, xs in samples.items() if k not in self.settled}
                for k, why in settle(live, self.widths, self.spec,
                                     self.rates.get(group)).items():
                    self.settled[k] = why
                    self.job_notice(k, why, len(samples[k]))
        if self._key(s) in self.settled:
            self.skipped += 1
            return True
        return False

    def measured(self, s: Slot, g: dict) -> None:
        key = self._key(s)
        candidate = s.variant is s.partner and s.variant.name != s.reference
        if not candidate:
            self.baselines[(key, s.repetition)] = g
            return
        self.widths[key] = int(s.knob_value) if s.knob == "num_draft_tokens" else None
        xs = self.samples.setdefault(self._group(s), {}).setdefault(key, [])
        ok = not g.get("unreliable") and g.get("decode_tok_s")
        self.rates.setdefault(self._group(s), {}).setdefault(key, []).append(
            g["decode_tok_s"] if ok else None)
        base = self.baselines.get((key, s.repetition))
        # only reliable pairs are evidence; an unreliable one is measured and reported,
        # and holds its round's place (None) so candidates pair the same rounds
        if base and not g.get("unreliable") and not base.get("unreliable") \
                and g.get("decode_tok_s") and base.get("decode_tok_s"):
            xs.append(g["decode_tok_s"] / base["decode_tok_s"])
        else:
            xs.append(None)

    def job_notice(self, key: tuple, why: str, n: int) -> None:
        workload, variant, knob, value, _ = key
        what = f"{knob}={json.loads(value)}" if knob else variant
        self.journal.emit("notice", workload=workload, variant=variant, adaptive=True,
                          repetitions=n, message=stop_message(what, why))
