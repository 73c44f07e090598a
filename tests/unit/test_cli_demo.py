"""`twinkle-jobs demo --url`: a refused submit is told as the API's message, with what to do."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from twinkle_cli.demo import _hint
from twinkle_cli.main import cli
from twinkle_client import APIError


def test_a_refused_submit_reads_as_the_envelopes_message_and_says_where_the_files_are() -> None:
    envelope = {
        "error": {
            "type": "invalid_request_error",
            "code": "invalid_value",
            "message": "spec.model.model_id: /data/demo/model is outside the allowed data roots",
            "param": "spec.model.model_id",
        }
    }
    refused = APIError.from_response(httpx.Response(422, json=envelope))
    assert str(refused) == (
        "422 invalid_request_error: spec.model.model_id: /data/demo/model is outside the allowed data roots "
        "(param: spec.model.model_id)"
    )
    assert "TWINKLE_DATA_DIR" in _hint(refused, own_stack=False)
    assert _hint(refused, own_stack=True) == ""  # its own server reads its own data dir
    # A refusal that is not about the demo's files gets no word about them.
    envelope["error"].update(param="spec.training.max_steps", message="spec.training.max_steps: >= 1")
    assert _hint(APIError.from_response(httpx.Response(422, json=envelope)), own_stack=False) == ""
    assert (
        str(APIError.from_response(httpx.Response(502, text="bad gateway"))) == "502 api_error: bad gateway"
    )


def test_a_server_that_is_not_there_is_named_without_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TWINKLE_DATA_DIR", str(tmp_path))
    url = "http://127.0.0.1:9"  # the discard port: nothing listens there
    result = CliRunner().invoke(cli, ["demo", "--url", url, "--token", "t", "--steps", "1"])
    assert result.exit_code == 1, result.output
    assert f"cannot reach the server at {url}" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
