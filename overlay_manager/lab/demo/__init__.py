"""lab.demo."""
