"""lab.bench."""
