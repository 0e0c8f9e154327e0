"""Fixtures shared by the farm's multi-node tests."""

from __future__ import annotations

import pytest

from tests.farm.ray_nodes import RayNodes


@pytest.fixture
def nodes():
    """A cluster of `ray start` processes; the test starts its head and nodes, and all are killed after it,
    whatever it did."""
    cluster = RayNodes()
    try:
        yield cluster
    finally:
        cluster.stop()
