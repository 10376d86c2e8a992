from pathlib import Path

import pytest

from tests.preprocess_service.api.fake_backend import make_fake


@pytest.fixture
def fake(tiny_converted: Path):
    """A service on the fake llama-server: (AppState, FakeLlamaServer)."""
    return make_fake(tiny_converted)
