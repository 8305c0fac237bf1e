"""The review: the sweep page, the weekly signal → action review (series, gates, rules,
regressions, charts), reproducibility checks, and rendering them (HTML, Markdown, JSON)."""
