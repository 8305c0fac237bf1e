"""From stored runs to decisions: series, gates, signals → actions, regressions, repro."""
