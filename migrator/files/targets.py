"""Whether a target may be written, for local paths and URLs alike: the local checks are in
`storage.atomic` (files) and `storage.atomic_folder` (folders), the object store's in
`storage.remote.upload` and `files.remote_sharded`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..storage.remote import is_url, url_of

if TYPE_CHECKING:
    from ..storage.remote.options import StorageOptions


def check_folder_target(target: Any, *, overwrite: bool, protect: Any = (), outputs: Any = (),
                        names: Any = None, storage: StorageOptions | None = None) -> None:
    """`atomic_folder.check_folder_target`, or the object store's own check for a URL (with its
    options from `storage`)."""
    if is_url(target):
        from ..storage.remote.upload import check_remote_target
        from .remote_sharded import check_remote_folder

        url = url_of(target)
        check_remote_target(url + "/", overwrite=True, storage=storage)  # http(s) is read-only
        check_remote_folder(url, overwrite=overwrite, storage=storage)
        return
    from ..storage.atomic_folder import check_folder_target as local
    from .sharded import model_parts

    local(target, overwrite=overwrite, protect=protect, outputs=outputs, names=names, owned=model_parts)


def check_target(target: Any, *, overwrite: bool, protect: Any = (), outputs: Any = (),
                 storage: StorageOptions | None = None) -> None:
    """`atomic.check_target`, or the object store's own check for a URL."""
    if is_url(target):
        from ..storage.remote.upload import check_remote_target

        check_remote_target(url_of(target), overwrite=overwrite, protect=protect, storage=storage)
        return
    from ..storage.atomic import check_target as local

    local(target, overwrite=overwrite, protect=protect, outputs=outputs)


def target_problems(target: Any, *, overwrite: bool, protect: Any = (),
                    storage: StorageOptions | None = None) -> list[str]:
    """`atomic.target_problems`, or the object store's own for a URL."""
    if is_url(target):
        from ..storage.remote.upload import target_problems as remote

        return remote(url_of(target), overwrite=overwrite, protect=protect, storage=storage)
    from ..storage.atomic import target_problems as local

    return local(target, overwrite=overwrite, protect=protect)
