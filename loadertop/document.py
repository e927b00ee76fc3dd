"""The snapshot document's public name for scripts (`loadertop.document.decode_json`, docs/contract.md
§3): the document itself lives in the headless client, `loadertop/client/document.py`."""

from loadertop.client.document import *  # noqa: F403
from loadertop.client.document import decode_json as decode_json
