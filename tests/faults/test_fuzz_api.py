"""schemathesis over the OpenAPI document, with real session and turn ids mixed in.

Every generated request must get a non-5xx answer with a problem body on errors. Bounded:
`TURNKIT_FUZZ_EXAMPLES` examples per operation (default 12).
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from tests.faults._table import FaultTable
from tests.support.server import serve
from turnkit import RuntimeConfig, SessionRuntime
from turnkit.demo import demo_agent
from turnkit.quickstart import create_app

pytestmark = [
    pytest.mark.slow,
    pytest.mark.faults,
    # schemathesis's own strategies use `random`; newer Hypothesis releases warn about it.
    pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning"),
]
EXAMPLES = int(os.environ.get("TURNKIT_FUZZ_EXAMPLES", "12"))


def test_no_generated_request_gets_a_server_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runtime = SessionRuntime(
        agent=demo_agent(), config=RuntimeConfig(database_url=f"sqlite:///{tmp_path / 'f.db'}")
    )
    with serve(create_app(runtime)) as url:
        seeded = httpx.post(
            f"{url}/api/harness/sessions/fuzz/execute", json={"content": "What is 2+3?"}, timeout=30
        )
        real = {"turn_id": seeded.headers["x-turn-id"], "session_id": "fuzz", "request_id": "req_x"}
        schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
        calls = errors = 0
        for result in schema.get_all_operations():
            operation = result.ok()

            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                phases=[Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy(), use_real=st.booleans())
            def check(case: schemathesis.Case, use_real: bool) -> None:
                nonlocal calls, errors
                if use_real and case.path_parameters:
                    for name in case.path_parameters:
                        if name in real:
                            case.path_parameters[name] = real[name]
                response = case.call(base_url=url, timeout=15)
                calls += 1
                if response.status_code >= 500:
                    errors += 1
                assert response.status_code < 500, (
                    f"{case.method} {case.formatted_path} -> {response.status_code}: "
                    f"{response.text[:300]}"
                )
                if response.status_code >= 400:
                    content_type = response.headers.get("content-type") or [""]
                    assert str(content_type[0]).startswith("application/problem+json"), (
                        f"{case.method} {case.formatted_path} -> {response.status_code}"
                    )

            check()
    table = FaultTable(trials=calls, extra={"server errors": errors})
    table.show("API fuzz (schemathesis over the OpenAPI document)", capsys)
    assert calls >= EXAMPLES
