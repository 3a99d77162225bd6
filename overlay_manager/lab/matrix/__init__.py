"""lab.matrix."""
