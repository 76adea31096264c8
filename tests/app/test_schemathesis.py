"""Property-based tests of the whole API from its own OpenAPI schema (schemathesis): no input produces a
5xx and every response matches the schema. Bounded: a fixed number of examples per endpoint."""

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from app.main import create_app
from app.settings import Settings

# Small limits keep every generated request cheap; the limits themselves are part of what is tested.
# A search of the schema's worked example (GPT-3 on 1,024 A100) enumerates ~270,000 layouts: at a limit of
# 5,000 it is refused up front, as any search over the limit must be, and a generated search that passes the
# limit (GPT-3 on fewer nodes) stays well inside the 10 s a call may take even on a loaded machine.
app = create_app(
    Settings(max_devices=4096, max_verify_elements=1 << 16, max_price_transfers=1 << 14, max_search_layouts=5_000)
)
schema = schemathesis.openapi.from_asgi("/openapi.json", app)
EXAMPLES = 100
# Semantic rules (divisibility of heads by tp, world size vs cluster) cannot be written in JSON Schema, so a
# schema-valid request may rightly get a 422: positive_data_acceptance is not among the checks.
CHECKS = [not_a_server_error, response_schema_conformance, status_code_conformance, content_type_conformance]


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_5xx_and_responses_match_schema(case):
    response = case.call()
    assert response.status_code < 500, response.text
    case.validate_response(response, checks=CHECKS)
