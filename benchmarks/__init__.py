"""tokenfront benchmarks: speed measured side by side against the reference path, reported as ratios."""
