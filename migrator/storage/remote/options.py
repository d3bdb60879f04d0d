"""Storage options (a recipe's `storage_options:`): refused when they hold a credential, then kept
per URL prefix for the code that opens that URL.

Standard library only, like the package's `__init__`: a run on local paths never loads fsspec.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from ...core.errors import MigratorError
from . import is_url, url_of

_SECRET = re.compile(r"(^|_)(key|keys|secret|token|password|passwd|pwd|credential|credentials|sas|signature|"
                     r"private|auth|authorization|session|connection_string|account_key)($|_)", re.IGNORECASE)
_ALLOWED = frozenset({"endpoint_url", "profile", "region_name", "client_kwargs", "config_kwargs", "anon",
                      "requester_pays", "use_ssl", "version_aware", "cache_regions", "default_fill_cache",
                      "project", "account_name", "location", "s3_additional_kwargs", "revision", "endpoint",
                      "headers", "block_size", "use_listings_cache", "skip_instance_cache", "max_concurrency"})
"""Keys known not to hold secrets, even where a word in them looks like one."""
_NO_SECRET_VALUES = {"token": frozenset({"anon"})}
"""Values that name no credential for a key that otherwise holds one: gcsfs's `token: anon` is anonymous
access (a public bucket, an emulator), and skips its search for credentials."""


def secret_key(options: Mapping[str, Any], where: str = "") -> str | None:
    """The first key (dotted, nested ones too) that looks like a credential, or None."""
    for k, v in options.items():
        name = f"{where}{k}"
        if isinstance(k, str) and isinstance(v, str) and v in _NO_SECRET_VALUES.get(k, ()):
            continue
        if not isinstance(k, str) or (k not in _ALLOWED and _SECRET.search(k)):
            return name
        if isinstance(v, Mapping):
            found = secret_key(v, name + ".")
            if found is not None:
                return found
    return None


def check_storage_options(options: Mapping[str, Any], where: str = "storage_options") -> None:
    """Refuse keys that look like credentials (`key`, `secret`, `token`, `password`, ...), nested ones too."""
    bad = secret_key(options)
    if bad is not None:
        raise MigratorError(
            f"{where}.{bad} looks like a credential; credentials never go in a recipe: use the environment "
            "(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, AWS_PROFILE, "
            "GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_*, HF_TOKEN) or the protocol's config files")


_OPTIONS: dict[str, dict[str, Any]] = {}


def register_options(url: str | os.PathLike[str], options: dict[str, Any] | None) -> None:
    """Storage options (a recipe's `storage_options:`) for `url` and everything below it.

    Checked for secrets first (`check_storage_options`). Kept per process: the recipe's paths are
    opened and written by code far from the recipe (sharded folders, templates).
    """
    if not options or not is_url(url):
        return
    check_storage_options(options)
    _OPTIONS[url_of(url).rstrip("/")] = dict(options)


def options_for(url: str) -> dict[str, Any]:
    """The options registered for the longest prefix of `url` (none: the protocol's defaults)."""
    best = ""
    for prefix in _OPTIONS:
        if (url == prefix or url.startswith(prefix.rstrip("/") + "/")) and len(prefix) > len(best):
            best = prefix
    return dict(_OPTIONS[best]) if best else {}
