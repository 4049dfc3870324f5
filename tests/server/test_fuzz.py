"""Property-based fuzzing of the OpenAPI schema (schemathesis): whatever the generated paths, queries and
headers, the server never answers 5xx, and its status codes, content types and bodies match the schema. The API
runs on a real uvicorn server in the test's process (tests/server/conftest.py's api_in_process): what is fuzzed is
the app `hpo serve` runs, over the finished tiny experiment.

`make test` draws the same examples every run (the derandomized `ci` profile of tests/conftest.py); `make fuzz`
explores new seeds with more examples, and `make fuzz SEED=N` replays one."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from tests.conftest import CI_PROFILE, examples
from tests.server.conftest import EXPERIMENT, api_in_process

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
EXAMPLES_PER_OPERATION = examples(ci=10, fuzz=200)

pytestmark = pytest.mark.hypothesis  # `make fuzz` selects it: the examples are drawn inside the test


@pytest.fixture(scope="module")
def api_schema(finished_experiment):
    with api_in_process(finished_experiment("sqlite")) as api:
        url = str(api.base_url).rstrip("/")  # http://127.0.0.1:PORT/api/v1
        loaded = schemathesis.openapi.from_url(f"{url}/openapi.json")
        loaded.config.update(base_url=url.removesuffix("/api/v1"))
        yield loaded


def test_no_server_errors_and_responses_match_the_schema(api_schema):
    # Driven through hypothesis directly: schemathesis' pytest plugin does not work with pytest 9 yet.
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) == 16  # every endpoint is fuzzed

    for operation in operations:

        @given(case=operation.as_strategy(), real=st.booleans(), number=st.integers(0, 4))
        @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        def call(case, real, number):
            if real and case.path_parameters:  # half the cases reach stored data, not only a 404
                case.path_parameters["name"] = EXPERIMENT
                if "number" in case.path_parameters:
                    case.path_parameters["number"] = number
            case.call_and_validate(checks=CHECKS)

        call()


def test_make_test_draws_the_same_examples_every_run():
    """Under the default profile two runs of one property draw the same examples; `make fuzz` draws new ones."""
    if settings.get_current_profile_name() != CI_PROFILE:
        pytest.skip("the fuzz profile draws new examples on purpose")
    assert settings.default.derandomize and settings.default.database is None

    def draw() -> list[str]:
        seen: list[str] = []

        @given(st.text())
        def record(text):
            seen.append(text)

        record()
        return seen

    first = draw()
    assert len(first) == settings.default.max_examples and len(set(first)) > 10 and draw() == first
