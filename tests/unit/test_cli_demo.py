"""`twinkle-jobs demo --url`: a refused submit is told as the API's message, with what to do."""

from __future__ import annotations

import httpx

from twinkle_cli.demo import _hint
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
    refused = httpx.Response(422, json=envelope)
    assert str(APIError.from_response(refused)) == (
        "422 invalid_request_error: spec.model.model_id: /data/demo/model is outside the allowed data roots "
        "(param: spec.model.model_id)"
    )
    assert "TWINKLE_DATA_DIR" in _hint(refused, own_stack=False)
    assert _hint(refused, own_stack=True) == ""  # its own server reads its own data dir
    assert (
        str(APIError.from_response(httpx.Response(502, text="bad gateway"))) == "502 api_error: bad gateway"
    )
