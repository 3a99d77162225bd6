"""Test support: fakes and helpers shared by the unit, rostest and lab code (never installed)."""
