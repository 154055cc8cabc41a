"""The e2e tier reuses the integration tier's stack (the real PostgreSQL and Kafka)."""

from tests.integration.conftest import stack

__all__ = ["stack"]
