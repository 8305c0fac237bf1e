"""The embedded default: local node, SQLite, the project's own model pair."""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import replace
from importlib import metadata
from pathlib import Path

from agent.protocol import DEFAULT_SWEEP

from .demo_models import build_demo_models
from .errors import SpecfleetError
from .fleet.inventory import load_inventory
from .review.report import write_review
from .review.sweep_page import render_review
from .store import open_store, queries
from .sweep.dispatch import StderrProgress, SweepOptions, start_sweep
from .sweep.lock import load_lock, write_lock
from .sweep.plan import load_plan

LOCAL_INVENTORY = Path(__file__).resolve().parent / "inventory" / "local.yml"


def demo_plan(models: Path, max_tokens: int | None = None) -> str:
    """A plan for the demo pair on this machine: its own Python and installed versions."""
    pins = [f"{d}=={metadata.version(d)}" for d in ("mlx", "mlx-lm")]
    lines = ["# The embedded demo: this machine, the project's own model pair.",
             "name: demo", "environment:",
             f'  python: "{sys.version_info.major}.{sys.version_info.minor}"',
             f"  packages: {json.dumps(pins)}",
             "  platforms: []   # unmanaged: the local node runs the controller's Python",
             "models:", f"  target: {models / 'target'}",
             "  # the draft and its 8-bit and 4-bit tiers: the review walks the fallback ladder",
             f"  draft: [{', '.join(str(models / d) for d in ('draft', *DEMO_TIERS))}]",
             "workloads:", "  use: [code, memo, translation]", "  context: [short]",
             "  # the JSON / tool-call task set: the demo pair passes none of it (0% for",
             "  # every config, baseline included), so the demo leaves it off; turn it on",
             "  # for real models",
             "  quality: false"]
    if max_tokens:
        lines.append(f"  max_tokens: {max_tokens}")
    lines += ["sweep:", f"  knobs: {{num_draft_tokens: {DEFAULT_SWEEP['num_draft_tokens']}}}",
              # twice: a width's two trials beside its baseline's eight decide the trained
              # pair's slower widths (0.55-0.78x on a quiet host) through the noise, where
              # one trial beside four left the `code` series undecided (upper bounds
              # 1.18 against the 1.16 gate, 2026-11-28); two trials pool their spread with
              # the baseline's (review/through_noise.ratio_interval)
              f"  repetitions: {DEMO_REPETITIONS}"]
    return "\n".join(lines) + "\n"


DEMO_REPETITIONS = 2
DEMO_TIERS = {"draft-8bit": 8, "draft-4bit": 4}  # made from the demo draft with mlx_lm.convert
# the calibration target grown from the demo draft: 16 layers win ~2x on a 2-core CPU while
# a whole draft-and-verify round stays under the 50 ms ITL p95 gate at every width
CALIBRATION_FOLDER, CALIBRATION_LAYERS = "draft-grown-16", 16
# its baseline decodes ~5x slower than the trained pair's; 96 tokens leave a 47-token decode
# slope (agent.stats.decode_rates keeps at least half): at 64, the slope of a width-4 trial
# spanned ~60-120 ms, and one scheduler tick moved a round's speedup by a fifth or more
CALIBRATION_MAX_TOKENS = 96


# widths whose answer can settle: on this 2-core CPU (bench/calibration.py, 16 layers) width
# 4 is predicted 2.84x, widths 1 and 2 1.85x and 1.87x (0.65 of it). Width 6 (2.73x) would
# sit within the tolerance of 4, and a width within it never stops early (by the rule:
# the two are one answer), so with it the best could never be the last one left
CALIBRATION_WIDTHS = [1, 2, 4]
# at most 12 rounds, a decision after each from the 4th: a settled winner stops the sweep
# early on a quiet node; on a noisy VM (trials varying 15-35% when idle) 8 rounds settled
# width 4 against width 2 (~12% apart) in one of three quiet demos (2026-11-28)
CALIBRATION_REPETITIONS = 12
CALIBRATION_ADAPTIVE = {"tolerance": 0.05, "confidence": 0.8, "min_repetitions": 4}
# the calibration pair's first token waits for a whole draft-and-verify round of a target
# that is the draft plus layers writing nothing: a cost of the construction, not of any
# model, which its own plan declares off (the review says so beside the gate)
CALIBRATION_TTFT_LIMIT = 10.0
# likewise its speculative tokens arrive a round at a time: the gap between chunks (ITL) is
# a whole round of that target (k draft steps and a k+1-token verification), 35-60 ms on a
# noisy 2-core VM against the default 50 ms ceiling (2026-11-28: "itl_p95_ms undecided" at
# width 4 while its speedup cleared the gate); its own plan raises the ceiling, said beside
CALIBRATION_ITL_CEILING_MS = 120.0


def calibration_plan(models: Path, max_tokens: int | None = None) -> str:
    """The demo's known answer: the calibration pair (a target grown from the demo draft
    with identity layers: acceptance 1.0, a predictable win) on one workload, with the
    draft's 4-bit tier beside it (the ladder), measured adaptively (it stops on a winner)."""
    pins = [f"{d}=={metadata.version(d)}" for d in ("mlx", "mlx-lm")]
    return "\n".join([
        "# The demo's calibration pair: a target grown from the demo draft with identity",
        "# layers (acceptance 1.0 by construction). An instrument, not a model.",
        "name: demo-calibration", "environment:",
        f'  python: "{sys.version_info.major}.{sys.version_info.minor}"',
        f"  packages: {json.dumps(pins)}", "  platforms: []",
        "models:", f"  target: {models / CALIBRATION_FOLDER}",
        "  # the draft (acceptance 1.0) and its 4-bit tier: the review walks the ladder",
        f"  draft: [{models / 'draft'}, {models / 'draft-4bit'}]",
        "workloads:", "  use: [code]", "  context: [short]", "  quality: false",
        f"  max_tokens: {min(max_tokens or CALIBRATION_MAX_TOKENS, CALIBRATION_MAX_TOKENS)}",
        "sweep:", f"  knobs: {{num_draft_tokens: {json.dumps(CALIBRATION_WIDTHS)}}}",
        "  # adaptive: a width stops once its paired difference against the best excludes",
        "  # the 5% tolerance (known slower), and the best once it is the last one left and",
        "  # beats its baseline beyond it (settled): at least 4, at most 12 repetitions; the",
        "  # settings bench/adaptive.py checks (no wrong pick where the full grid is right)",
        f"  repetitions: {CALIBRATION_REPETITIONS}",
        "  adaptive: {" + ", ".join(f"{k}: {v}" for k, v in CALIBRATION_ADAPTIVE.items()) + "}",
        "gates:",
        "  # what a calibration pair checks is decode speed: its speculative first token waits",
        "  # for a whole draft-and-verify round, which this tiny target's short prefill cannot",
        "  # hide (+20-60%), so the TTFT gate is declared off here (the review says why beside",
        "  # the gates that judged it); the ITL ceiling is raised for the same reason (a round",
        "  # of this target arrives at once); every other gate is the default",
        f"  ttft_regression_limit: {CALIBRATION_TTFT_LIMIT}",
        f"  itl_p95_ceiling_ms: {CALIBRATION_ITL_CEILING_MS}"]) + "\n"


def build_demo_calibration(models: Path, log=print) -> Path:
    """The demo's calibration target, cached by content (see ``ensure_calibration``)."""
    from .calibration import ensure_calibration

    return ensure_calibration(models / "draft", models / CALIBRATION_FOLDER,
                              CALIBRATION_LAYERS, log)


def build_demo_tiers(models: Path, log=print) -> None:
    """The demo draft's lighter tiers, made once and remade when the draft changed (each
    tier records the fingerprint of the weights it was made from)."""
    from agent.fingerprint import fingerprint

    from .tiers import TIER_FILE, quantize

    source = fingerprint(models / "draft")
    for name, bits in DEMO_TIERS.items():
        out = models / name
        record = out / TIER_FILE
        if record.is_file() and json.loads(record.read_text()).get(
                "source_fingerprint") == source:
            continue
        shutil.rmtree(out, ignore_errors=True)
        quantize(models / "draft", out, bits)
        log(f"made the {bits}-bit tier of the demo draft: {out}")


def run_demo(workdir: Path, *, max_tokens: int | None = None, log=print,
             announce=lambda sweep_id: None) -> Path:
    """Build models (and the draft's tiers), lock a plan, sweep the local node, render the
    review."""
    workdir = workdir.resolve()
    models = workdir / "models"
    build_demo_models(models, log=log)
    build_demo_tiers(models, log=log)
    build_demo_calibration(models, log=log)
    store = open_store(f"sqlite:///{workdir / 'specfleet.db'}")
    # the trained pair (a loss on a CPU), then the calibration pair (a known win)
    for plan_name, text, page in (("demo-plan.yml", demo_plan(models, max_tokens), "sweep.html"),
                                  ("demo-calibration.yml", calibration_plan(models, max_tokens),
                                   "calibration.html")):
        plan_path = workdir / plan_name
        plan_path.write_text(text)
        sweep_id = _sweep(workdir, load_lock(write_lock(load_plan(plan_path), log)), store, log,
                          announce)
        render_review(store, workdir / page, sweep_id)
    return write_demo_review(store, workdir)


def write_demo_review(store, workdir: Path) -> Path:
    """The weekly review and the runtime policy beside it. The demo asks for the calibration
    series in the policy (``review --policy-calibration``): its known win is switched on
    there, marked provisional with its nights; the trained pair's one night switches nothing
    on."""
    from .review.report import review_analysis
    from .review.verdict import policy

    a = review_analysis(store)
    (workdir / "policy.json").write_text(json.dumps(policy(a, calibration=True), indent=2,
                                                    sort_keys=True) + "\n")
    return write_review(store, workdir / "review.html", analysis=a,
                        policy_calibration=True)["html"]


def _sweep(workdir: Path, doc: dict, store, log, announce) -> str:
    """Sweep the local node with one lock; keep the sweep's events beside the store."""
    # Keep the demo self-contained: the local node's files live in the workdir.
    hosts = [replace(h, root=str(workdir / "node")) for h in load_inventory(LOCAL_INVENTORY).hosts]
    result = start_sweep(doc, hosts, store, inventory=str(LOCAL_INVENTORY),
                         opts=SweepOptions(provision=False), progress=StderrProgress(),
                         announce=announce)
    if result.status == "unreliable":  # the pages still show what was measured, and why
        log("; ".join(f"{o.host}: {o.detail}" for o in result.outcomes if o.detail))
    elif result.status != "ok":
        details = "; ".join(f"{o.host}: {o.detail}" for o in result.outcomes if o.detail)
        raise SpecfleetError(f"demo sweep {result.sweep_id} did not "
                             f"{'start' if result.status == 'busy' else 'finish'}: {details}")
    # one file per sweep: the weekly review pools every demo sweep of the week, so every
    # sweep's events stay on disk beside it
    events = workdir / f"events-{result.sweep_id}.jsonl"
    # read as readers read them (store.queries): typed; an unreadable one is not exported
    rows = queries.typed(queries.events(store, [result.sweep_id], order=("node", "seq")))
    events.write_text("".join(json.dumps(s.event.to_json(), separators=(",", ":")) + "\n"
                              for s in rows))
    log(f"sweep {result.sweep_id}: {sum(o.value['events'] for o in result.outcomes)} events "
        f"stored; events written to {events}")
    return result.sweep_id


def declare_store(workdir: Path, folder: Path | None = None) -> Path | None:
    """Write ``specfleet.toml`` here pointing at the demo's store, so later commands in
    this folder read it without --db; only when no specfleet.toml applies here yet (one
    the user wrote is never changed) and SPECFLEET_CONFIG does not choose one (or none).
    Returns the file written."""
    import os

    from . import project_config

    folder = (folder or Path.cwd()).resolve()
    if os.environ.get("SPECFLEET_CONFIG") or project_config.find(folder) is not None:
        return None
    db = workdir.resolve() / "specfleet.db"
    try:
        rel = db.relative_to(folder)
    except ValueError:
        rel = db
    path = folder / project_config.NAME
    path.write_text("# Written by `specfleet demo`: commands run in this folder read the demo's "
                    "store.\n# Point db at your own store (or delete this file) when you "
                    f"start measuring.\ndb = \"sqlite:///{rel}\"\n")
    return path


def next_steps(workdir: Path, exe: str = "specfleet", declared: bool = False) -> list[str]:
    """What to open or run after the demo: its two pages and a command that reads its
    store (printed by `specfleet demo`; without a specfleet.toml naming the store, --db)."""
    workdir = workdir.resolve()
    db = "" if declared else f" --db sqlite:///{workdir / 'specfleet.db'}"
    return ["next:",
            f"  this sweep, baseline vs each draft width:  {workdir / 'sweep.html'}",
            f"  the calibration pair's sweep (a known win): {workdir / 'calibration.html'}",
            f"  the weekly review (one verdict per series): {workdir / 'review.html'}",
            f"  the store from the command line:            {exe} sweeps list{db}",
            f"  the runtime policy (calibration asked in):  {workdir / 'policy.json'}"]
