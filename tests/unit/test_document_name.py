"""`loadertop.document.decode_json`, the name docs/contract.md §3 gives scripts, is the client's."""

import msgspec
import pytest

from loadertop import document
from loadertop.client import document as client_document


def test_the_public_name_validates_like_the_client():
    assert document.decode_json is client_document.decode_json
    assert document.Document is client_document.Document
    with pytest.raises(msgspec.ValidationError):
        document.decode_json(b'{"schema": "loadertop.snapshot/1"}')
