"""Storage options (a recipe's `storage_options:`): refused when they hold a credential, then carried
per URL prefix (`StorageOptions`, a value) to the code that opens that URL.

Standard library only, like the package's `__init__`: a run on local paths never loads fsspec.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
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


@dataclass(frozen=True)
class StorageOptions:
    """A run's storage options (a recipe's `storage_options:`), per URL prefix, as a value: what opens,
    lists, checks or writes a URL is given them (`fs.filesystem(url, storage)`), so two runs in one
    process never see each other's. A prefix holds for every URL below it; the longest one wins."""

    prefixes: tuple[tuple[str, Mapping[str, Any]], ...] = ()

    def adding(self, url: str | os.PathLike[str], options: Mapping[str, Any] | None) -> StorageOptions:
        """These options and `options` for `url` (a local path, or no options: unchanged). Refused
        when they hold a credential (`check_storage_options`)."""
        if not options or not is_url(url):
            return self
        check_storage_options(options)
        prefix = url_of(url).rstrip("/")
        kept = tuple((p, o) for p, o in self.prefixes if p != prefix)
        return StorageOptions((*kept, (prefix, dict(options))))

    def for_url(self, url: str) -> dict[str, Any]:
        """The options of the longest prefix of `url` (none: the protocol's defaults)."""
        best: tuple[str, Mapping[str, Any]] | None = None
        for prefix, options in self.prefixes:
            under = url == prefix or url.startswith(prefix.rstrip("/") + "/")
            if under and (best is None or len(prefix) > len(best[0])):
                best = (prefix, options)
        return dict(best[1]) if best is not None else {}


NO_STORAGE_OPTIONS = StorageOptions()
"""Every protocol's defaults (the environment's credentials and endpoints): `migrate inspect`, `convert`,
the Python API's `open_file` of a URL."""
