"""lab.campus."""
