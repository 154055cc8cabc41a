"""Schemathesis over the OpenAPI document: no generated request gets a 5xx, and every error is
a problem+json. Bounded: 25 examples per operation (a few hundred in all).

The operations' strategies are driven by Hypothesis directly: schemathesis' pytest plugin does
not support this pytest's version.
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.core.result import Ok

from tests.api.conftest import ADMIN_TOKEN

pytestmark = pytest.mark.integration

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
EXAMPLES_PER_OPERATION = 25


def test_no_generated_request_gets_a_server_error(api_url: str) -> None:
    schema = schemathesis.openapi.from_url(f"{api_url}/openapi.json")
    operations = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), f"the API's own OpenAPI document is invalid: {result}"
        operations.append(result.ok())
    assert len(operations) >= 14

    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def no_server_error(case: schemathesis.Case[Any]) -> None:
            response = case.call(base_url=api_url, headers=AUTH)
            assert response.status_code < 500, (
                f"{case.method} {case.formatted_path}: {response.text}"
            )
            if response.status_code >= 400:
                assert response.headers["content-type"][0] == "application/problem+json"

        no_server_error()
