"""Which baseline the sweep page reads a section's speedups against, taken from the weekly
review's own choice.

With two autoregressive configs at one sampling (two http baseline variants) the page once
pooled both into one baseline row and read its speedups against their pooled median (2.68×
where the weekly review read 2.00× against the one baseline it chose), and one noisy
variant voided every speedup though the other was reliable (audit 42). The weekly review
chooses one baseline per sampling (``through_noise.baseline_at``, the rule ``series``
judges by); here that choice is read from its judged sections of this sweep
(``sweep_noise.weekly_sections``): the page compares with the chosen config alone and
shows each other one as a row of its own, never compared with and never voiding a
speedup. Where the weekly review chose none (or no section of it speaks for the page's),
the page pools its baselines as before."""

from __future__ import annotations

from agent.events import Generation

from ..store import Store, queries
from ..store.db import config_key, result_pair
from ..store.models import Measurement
from .sweep_noise import SectionKey
from .through_noise import baseline_at

# a baseline config at a sampling with more than one: (its config key, how its row is named,
# whether the weekly review chose it: the one the section's speedups are read against)
Choice = tuple[str, str, bool]


def baseline_choices(judged: dict[SectionKey, list[dict]]
                     ) -> dict[SectionKey, dict[str, tuple[str, bool]]]:
    """{page section: {config key: (its name, chosen)}} of the baseline configs at each
    sampling where the weekly review chose one of several (``through_noise.baseline_at``,
    in any of the section's series); only the sections where it made such a choice."""
    out: dict[SectionKey, dict[str, tuple[str, bool]]] = {}
    for key, sections in judged.items():
        chosen: set[str] = set()
        names: dict[str, str] = {}
        for s in sections:
            bases = [c for c in s.get("configs") or [] if c["mode"] == "baseline"]
            for sampling in dict.fromkeys(c["sampling"] for c in bases):
                at = [c for c in bases if c["sampling"] == sampling]
                pick = baseline_at(s, sampling)
                if len(at) < 2 or pick is None:
                    continue
                chosen.add(pick["config_id"])
                names.update((c["config_id"], _name(c)) for c in at)
        if names:
            out[key] = {ck: (name, ck in chosen) for ck, name in names.items()}
    return out


def not_chosen(choices: dict[SectionKey, dict[str, tuple[str, bool]]]
               ) -> dict[SectionKey, set[str]]:
    """{page section: the config keys of its baselines the weekly review did not choose}."""
    return {key: {ck for ck, (_, chosen) in cs.items() if not chosen}
            for key, cs in choices.items()}


def _name(c: dict) -> str:
    variant = (c.get("knobs") or {}).get("variant")
    return f"variant {variant}" if variant else c.get("label") or c["config_id"]


def choice_runs(store: Store, sweep_id: str,
                choices: dict[SectionKey, dict[str, tuple[str, bool]]]
                ) -> dict[tuple[str, int], Choice]:
    """{(node, seq): its config's choice} for each baseline generation of ``sweep_id`` in a
    section where the weekly review chose one of several baselines (``baseline_choices``):
    a generation's config is read from its stored event (its measurement row keeps one
    knob, not the config)."""
    out: dict[tuple[str, int], Choice] = {}
    for node in sorted({n for n, _ in choices}):
        for s in queries.typed(queries.events(store, [sweep_id], ("generation",), node=node)):
            e = s.event
            if not isinstance(e, Generation) or e.mode != "baseline":
                continue
            pair = result_pair(e)
            ck = config_key(pair, e.config)
            found = choices.get((node, (e.workload, pair)), {}).get(ck)
            if found is not None:
                out[(node, e.seq)] = (ck, *found)
    return out


def split_baselines(base: list[Measurement], chose: dict[tuple[str, int], Choice]
                    ) -> tuple[list[Measurement], list[tuple[str, str, list[Measurement]]]]:
    """A section's baseline runs: those it compares with (of the chosen config, or of a
    sampling where no choice was made), and each config not chosen as (its config key, its
    name, its runs), by name."""
    aside: dict[tuple[str, str], list[Measurement]] = {}
    kept = []
    for r in base:
        c = chose.get((r.node, r.seq))
        if c is not None and not c[2]:
            aside.setdefault(c[:2], []).append(r)
        else:
            kept.append(r)
    return kept, [(ck, name, runs) for (ck, name), runs in
                  sorted(aside.items(), key=lambda kv: kv[0][1])]


def named(label: str, runs: list[Measurement], chose: dict[tuple[str, int], Choice]) -> str:
    """A baseline row's label, naming the config the weekly review chose where it chose one
    of several ("baseline (autoregressive), variant a-plain")."""
    names = {chose[(r.node, r.seq)][1] for r in runs if (r.node, r.seq) in chose}
    return f"{label}, {names.pop()}" if len(names) == 1 else label


def other_key(node: str, workload: tuple, ck: str) -> tuple:
    """How the page keys a not-chosen baseline config's marks (its flags, parity, KV
    cache): by its config, apart from the baseline its section compares with."""
    return (node, workload, "baseline", "config", ck)
