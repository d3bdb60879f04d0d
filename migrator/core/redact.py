"""URL credentials out of everything migrator shows or stores.

A URL may carry a secret two ways: user info (`https://user:password@host/`) and a query (an S3
presigned URL's `X-Amz-Signature`, a GCS signed URL's `X-Goog-Signature`, an Azure SAS token's
`sig`). `redact` is the one rule every output follows: error messages (`storage.remote`), terminal
text (`display.escape`) and JSON on stdout, in reports and in HTML pages (`display.json_text`).
It imports nothing but `re`, so the core can use it and a local run pays nothing for it.
"""

from __future__ import annotations

import re

__all__ = ["redact"]

_URL_END = "\\s'\"<>`"
"""Characters that end a URL inside other text: whitespace, quotes (a JSON string, a quoted path), angle brackets."""
_USERINFO = re.compile(rf"(?<=://)[^/?#{_URL_END}]*@")
"""The user info of a URL: everything of its authority up to the *last* '@' (a password may hold '@')."""
_QUERY = re.compile(rf"(://[^?#{_URL_END}]*)\?[^#{_URL_END}]*")
"""A URL's whole query, ':' and '@' included: presigned and SAS signatures, credentials, dates."""


def redact(text: str) -> str:
    """`text` with the user-info of every URL in it (`user:password@`) replaced by `***@`, and its
    query (a presigned URL's signature, a SAS token) by `?***`.

    The one rule for every URL migrator shows or stores: error messages, terminal text
    (`display.escape`), JSON on stdout, reports and HTML pages (`display.json_text`) all pass through
    it. A URL ends at whitespace, a quote or an angle bracket, so in JSON text it never reaches into
    the next string."""
    if "://" not in text:  # the common case: no URL at all
        return text
    return _QUERY.sub(r"\1?***", _USERINFO.sub("***@", text))
