"""lab.bench.node."""
