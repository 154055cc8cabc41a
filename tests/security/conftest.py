"""The security suites run on the real stack of the integration tier (and the API's fixtures)."""

from tests.api.conftest import api  # noqa: F401  (fixtures)
from tests.integration.conftest import settings, stack, store, topics  # noqa: F401
