"""Fixtures for unit tests."""
import pytest

from overlay_manager.testing.tsfake import FakeTailscaled


@pytest.fixture
def fake_tailscaled():
    """A fake tailscaled LocalAPI on a temporary unix socket, serving recorded JSON."""
    fake = FakeTailscaled()
    try:
        yield fake
    finally:
        fake.close()
