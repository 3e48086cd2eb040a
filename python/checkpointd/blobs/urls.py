"""``open_blobs(url)``: a blob store from a URL (docs/contract.md#python-api, docs/contract.md#command-line-and-configuration).

| URL | backend |
|---|---|
| ``memory://`` | a new, empty in-process store (each call its own) |
| ``file:///abs/dir`` | a local directory, created if missing |
| ``s3://bucket/prefix`` | S3 or any S3-compatible service (R2, MinIO, SeaweedFS...) |
| ``gs://bucket/prefix`` | Google Cloud Storage |
| ``az://container/prefix`` | Azure Blob Storage |

S3 settings come from the usual ``AWS_*`` environment variables (obstore reads
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
``AWS_REGION``/``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL``...), plus
``CHECKPOINTD_S3_ENDPOINT``; keyword arguments override them. An ``http://``
endpoint turns on ``allow_http`` (loopback test servers, in-cluster gateways).
GCS and Azure read their own ``GOOGLE_*`` / ``AZURE_*`` variables; extra keyword
arguments are passed to obstore's store config as is. An S3-compatible service
without conditional PUT (``If-None-Match``) takes ``conditional_put="disabled"``
(or ``AWS_CONDITIONAL_PUT=disabled``): existing blobs are then found with HEAD.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote, urlsplit

from obstore.exceptions import BaseError
from obstore.store import AzureStore, GCSStore, LocalStore, MemoryStore, ObjectStore, S3Store

from ..errors import SandboxCheckpointInvalidArgumentError
from .local import LocalBlobDir
from .object_store import ObjectBlobStore, error_summary

if TYPE_CHECKING:
    from obstore.store import AzureConfig, ClientConfig, GCSConfig, S3Config

SUPPORTED_SCHEMES = ("memory", "file", "s3", "gs", "az")

# The keywords of ``open_blobs`` that are S3 settings; they win over the
# environment. Its other keywords (but allow_http) are obstore config keys.
_S3_SETTINGS = ("endpoint", "region", "access_key_id", "secret_access_key", "session_token")
# Where an S3 endpoint may come from, first match wins (after the keyword).
_S3_ENDPOINT_VARIABLES = ("CHECKPOINTD_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")


def open_blobs(url: str, **settings: Any) -> ObjectBlobStore:
    """Open the blob store named by ``url`` (see the module docstring).

    ``settings``: ``endpoint``, ``region``, ``access_key_id``,
    ``secret_access_key`` and ``session_token`` (each a string, None = not
    given) apply to ``s3://``; ``allow_http`` (a bool) to ``s3://``, ``gs://``
    and ``az://``; any other keyword is an obstore config key for the cloud
    backends. Raises SandboxCheckpointInvalidArgumentError for an unknown
    scheme, a malformed URL, settings that do not apply, or a configuration
    obstore rejects (for example a key id without a secret).
    """
    if not isinstance(url, str):
        raise SandboxCheckpointInvalidArgumentError(f"blob store URL must be a string: {url!r}")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    options = dict(settings)
    s3_settings: dict[str, str | None] = {name: options.pop(name, None) for name in _S3_SETTINGS}
    allow_http: bool | None = options.pop("allow_http", None)
    given = sorted(name for name, value in s3_settings.items() if value is not None)
    if scheme in ("memory", "file"):
        if given or options or allow_http is not None:
            raise _invalid(url, f"options {given + sorted(options)} do not apply to {scheme}://")
        if scheme == "memory":
            return ObjectBlobStore(MemoryStore(), _public_url(url))
        local = _local_store(url)
        public = _public_url(url)
        return ObjectBlobStore(local, public, local_dir=LocalBlobDir(_local_path(url), public))
    if scheme not in ("s3", "gs", "az"):
        raise _invalid(url, f"unknown blob store scheme; use one of {_schemes_text()}")
    bucket, prefix = parts.netloc, unquote(parts.path).strip("/") or None
    if not bucket or "@" in bucket:
        raise _invalid(url, "expected <scheme>://<bucket>/<prefix> without credentials")
    if scheme != "s3" and given:
        raise _invalid(url, f"options {given} apply to s3:// only")
    store: ObjectStore
    try:
        if scheme == "s3":
            store = _s3_store(bucket, prefix, s3_settings, allow_http, options)
        elif scheme == "gs":
            gcs_config = cast("GCSConfig", options)
            store = GCSStore(
                bucket, prefix=prefix, config=gcs_config, client_options=_client(allow_http)
            )
        else:
            azure_config = cast("AzureConfig", options)
            store = AzureStore(
                bucket, prefix=prefix, config=azure_config, client_options=_client(allow_http)
            )
    except (BaseError, TypeError, ValueError) as error:
        raise _invalid(url, error_summary(error)) from error
    return ObjectBlobStore(store, _public_url(url))


def _s3_store(
    bucket: str,
    prefix: str | None,
    settings: dict[str, str | None],
    allow_http: bool | None,
    options: dict[str, Any],
) -> S3Store:
    config: dict[str, Any] = {name: value for name, value in settings.items() if value}
    endpoint = config.get("endpoint") or _first_env(_S3_ENDPOINT_VARIABLES)
    if endpoint:
        config["endpoint"] = endpoint
    if allow_http is None:
        allow_http = endpoint is not None and endpoint.lower().startswith("http://")
    config.update(options)
    return S3Store(
        bucket,
        prefix=prefix,
        config=cast("S3Config", config),
        client_options=_client(allow_http),
    )


def _local_path(url: str) -> str:
    """The directory of a ``file://`` URL, without a trailing slash."""
    parts = urlsplit(url)
    path = unquote(parts.path)
    if parts.netloc not in ("", "localhost") or not path.startswith("/"):
        raise _invalid(url, "expected file:///absolute/directory")
    return path.rstrip("/") or "/"


def _local_store(url: str) -> LocalStore:
    path = _local_path(url)
    if os.path.exists(path) and not os.path.isdir(path):
        raise _invalid(url, "the path exists and is not a directory")
    try:
        return LocalStore(path, mkdir=True)
    except (BaseError, OSError) as error:
        raise _invalid(url, error_summary(error)) from error


def _client(allow_http: bool | None) -> ClientConfig | None:
    return {"allow_http": True} if allow_http else None


def _first_env(names: tuple[str, ...]) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


def _public_url(url: str) -> str:
    """The URL without user info or query (where credentials could hide)."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return f"{parts.scheme}://{host}{parts.path}"


def _schemes_text() -> str:
    return ", ".join(f"{scheme}://" for scheme in SUPPORTED_SCHEMES)


def _invalid(url: str, why: str) -> SandboxCheckpointInvalidArgumentError:
    shown = _public_url(url) if "://" in url else url
    return SandboxCheckpointInvalidArgumentError(
        f"invalid blob store URL {shown!r}: {why}", details={"url": shown}
    )


__all__ = ["SUPPORTED_SCHEMES", "open_blobs"]
