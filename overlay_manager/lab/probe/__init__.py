"""lab.probe."""
