"""`specfleet demo --help`'s example, run as written (a module of its own so that it runs
beside the README test, not after it)."""

from tests.test_docs import Session, help_examples


def test_the_demo_example_runs_as_written(tmp_path):
    """`specfleet demo`'s --help example, in a scratch folder: the whole demo (the pair,
    two quantised drafts, a lineup sweep, the pages and the next steps)."""
    example = dict(help_examples())["demo"]
    s = Session(tmp_path)
    s.run(example, timeout=900)
    work = s.cwd / ".specfleet-demo"
    assert (work / "review.html").is_file() and (work / "sweep.html").is_file()
    # the calibration pair beside the trained one: its own page, and marked in the review
    assert 'id="calibration"' in (work / "calibration.html").read_text()
    review = (work / "review.html").read_text()
    assert "draft-grown-16 (calibration) / models/draft" in review
    assert "calibration pair (an instrument, not a model): " in review
    # a provisional verdict says so once, its ladder too ("…, provisional: 1 of 3 nights ·
    # ladder: step 3 (autoregressive only), provisional" said it twice)
    import json

    for s in json.loads((work / "review.json").read_text())["series"]:
        assert s["verdict"]["text"].count("provisional") <= 1, s["verdict"]["text"]
