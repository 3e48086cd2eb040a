"""Staging leftovers a killed writer leaves in a blob store, for the sweep.

* A ``file://`` directory: staging files ``<file>#<digits>`` (our writer's
  fallback when ``O_TMPFILE`` is missing, and obstore's ``LocalStore``), which
  obstore's listings hide. Their mtime is when the write began.
* An S3 bucket: unfinished multipart uploads under the store's prefix (a large
  blob's upload that never completed). obstore has no call for these (and its
  signed URLs cannot carry the ``?uploads`` / ``?uploadId=`` queries these
  calls need), so they are listed (ListMultipartUploads) and aborted
  (AbortMultipartUpload) with requests signed here (AWS Signature V4 over
  ``urllib``), with the store's own endpoint and region, and credentials found
  the way obstore finds them (``_credentials``): the store's
  ``credential_provider`` when it has one; else static keys (its config, else
  ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, with ``AWS_SESSION_TOKEN``);
  else a web identity (``AWS_WEB_IDENTITY_TOKEN_FILE`` + ``AWS_ROLE_ARN``,
  STS AssumeRoleWithWebIdentity); else the container endpoint
  (``AWS_CONTAINER_CREDENTIALS_RELATIVE_URI``, or ``..._FULL_URI`` with
  ``AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE``); else the instance metadata
  service (IMDSv2 at ``AWS_METADATA_ENDPOINT``, default 169.254.169.254; v1
  only with ``AWS_IMDSV1_FALLBACK``). Each setting is read from the store's
  config first, then from its variable, as obstore does. Profiles and SSO are
  not part of obstore's chain and are not here either. When no source answers,
  the sweep reports why, and the bucket's lifecycle rule
  (AbortIncompleteMultipartUpload) must do it.
* Any other store: nothing to do.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import hmac
import json
import os
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode, urlsplit
from xml.etree import ElementTree

from .base import BlobStore, BlobStoreError
from .object_store import ObjectBlobStore

# The prefixes blobs live under; staging leftovers are looked for there only.
BLOB_PREFIXES = ("sandbox-files", "sandbox-artifacts", "sandbox-packs")
_STAGING_NAME = re.compile(r".+#[0-9]+")
_S3_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
_TIMEOUT_S = 60


@dataclass(frozen=True, slots=True)
class StagingLeftover:
    name: str  # as reported: "<key>#<digits>" or "<key>?uploadId=<id>"
    started_ms: int
    path: str | None = None  # a local staging file
    key: str | None = None  # the object key of a multipart upload (bucket-relative)
    upload_id: str | None = None


class StagingUnavailableError(BlobStoreError):
    """The store's staging area cannot be listed from here (says why)."""


async def list_staging(blobs: BlobStore) -> list[StagingLeftover]:
    """Every staging leftover of ``blobs`` (module docstring); [] for a store
    that has none. Raises BlobStoreError when listing fails."""
    if not isinstance(blobs, ObjectBlobStore):
        return []
    if blobs.local_dir is not None:
        return await asyncio.to_thread(_local_leftovers, blobs.local_dir.root)
    s3 = await _S3Access.of(blobs)
    if s3 is None:
        return []
    return await asyncio.to_thread(s3.list_uploads)


async def remove_staging(blobs: BlobStore, leftover: StagingLeftover) -> None:
    """Remove one leftover (a missing one is not an error)."""
    if leftover.path is not None:
        try:
            await asyncio.to_thread(os.unlink, leftover.path)
        except FileNotFoundError:
            pass
        return
    assert isinstance(blobs, ObjectBlobStore) and leftover.key and leftover.upload_id
    s3 = await _S3Access.of(blobs)
    if s3 is None:
        raise StagingUnavailableError(f"{blobs.url}: not an S3 store")
    await asyncio.to_thread(s3.abort, leftover.key, leftover.upload_id)


def _local_leftovers(root: str) -> list[StagingLeftover]:
    found: list[StagingLeftover] = []
    for prefix in BLOB_PREFIXES:
        top = os.path.join(root, prefix)
        for directory, _dirs, files in os.walk(top):
            for name in files:
                if not _STAGING_NAME.fullmatch(name):
                    continue
                path = os.path.join(directory, name)
                try:
                    started = os.lstat(path).st_mtime_ns // 1_000_000
                except FileNotFoundError:
                    continue
                found.append(StagingLeftover(os.path.relpath(path, root), started, path=path))
    return found


@dataclass(frozen=True, slots=True)
class _S3Access:
    """Just enough of S3 for multipart leftovers, signed with SigV4."""

    url: str
    endpoint: str  # without a trailing slash
    bucket: str
    prefix: str
    region: str
    key_id: str
    secret: str
    token: str | None
    path_style: bool

    @classmethod
    async def of(cls, blobs: ObjectBlobStore) -> _S3Access | None:
        from obstore.store import S3Store

        store = blobs.object_store
        if not isinstance(store, S3Store):
            return None
        config: dict[str, Any] = dict(store.config)
        region = (
            config.get("region")
            or os.environ.get("AWS_REGION")
            or os.environ.get("AWS_DEFAULT_REGION")
            or "us-east-1"
        )
        try:
            credentials = await _credentials(store, config, region)
        except (OSError, ValueError, KeyError, ElementTree.ParseError) as error:
            raise StagingUnavailableError(
                f"unfinished multipart uploads on {blobs.url} were not listed: no credentials "
                f"({error}; set a lifecycle rule AbortIncompleteMultipartUpload)"
            ) from None
        key_id, secret, token = credentials
        bucket = str(config.get("bucket") or "")
        endpoint = config.get("endpoint")
        path_style = bool(endpoint) and str(
            config.get("virtual_hosted_style_request", "false")
        ).lower() not in ("true", "1")
        if not endpoint:
            endpoint = f"https://{bucket}.s3.{region}.amazonaws.com"
        prefix = (store.prefix or "").strip("/")
        return cls(
            blobs.url,
            str(endpoint).rstrip("/"),
            bucket,
            prefix,
            region,
            key_id,
            secret,
            token,
            path_style,
        )

    # ----------------------------------------------------------------- requests

    def _object_path(self, key: str) -> str:
        path = "/" + quote(key, safe="/-_.~")
        return f"/{self.bucket}{path}" if self.path_style else path

    def _bucket_path(self) -> str:
        return f"/{self.bucket}" if self.path_style else "/"

    def _request(self, method: str, path: str, query: dict[str, str]) -> bytes:
        now = dt.datetime.now(dt.UTC)
        amz_date = now.strftime("%Y%m%dT%H%M%SZ")
        day = now.strftime("%Y%m%d")
        host = urlsplit(self.endpoint).netloc
        payload = hashlib.sha256(b"").hexdigest()
        canonical_query = "&".join(
            f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(query.items())
        )
        headers = {"host": host, "x-amz-content-sha256": payload, "x-amz-date": amz_date}
        if self.token:
            headers["x-amz-security-token"] = self.token
        signed = ";".join(sorted(headers))
        canonical = "\n".join(
            [
                method,
                path,
                canonical_query,
                "".join(f"{name}:{headers[name]}\n" for name in sorted(headers)),
                signed,
                payload,
            ]
        )
        scope = f"{day}/{self.region}/s3/aws4_request"
        to_sign = "\n".join(
            ["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()]
        )
        key = ("AWS4" + self.secret).encode()
        for part in (day, self.region, "s3", "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        headers["authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={self.key_id}/{scope}, "
            f"SignedHeaders={signed}, Signature={signature}"
        )
        url = self.endpoint + path + (f"?{canonical_query}" if canonical_query else "")
        request = urllib.request.Request(url, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response:  # noqa: S310
                body: bytes = response.read()
                return body
        except urllib.error.HTTPError as error:
            if method == "DELETE" and error.code == 404:
                return b""  # already gone
            detail = error.read()[:300].decode("utf-8", "replace")
            raise BlobStoreError(
                f"{method} multipart uploads on {self.url} failed: HTTP {error.code} {detail}"
            ) from None
        except OSError as error:
            raise BlobStoreError(
                f"{method} multipart uploads on {self.url} failed: {error}"
            ) from None

    def list_uploads(self) -> list[StagingLeftover]:
        found: list[StagingLeftover] = []
        base = f"{self.prefix}/" if self.prefix else ""
        for blob_prefix in BLOB_PREFIXES:
            query = {"uploads": "", "prefix": f"{base}{blob_prefix}/"}
            while True:
                root = ElementTree.fromstring(self._request("GET", self._bucket_path(), query))
                for upload in root.iter(f"{_S3_NS}Upload"):
                    key = upload.findtext(f"{_S3_NS}Key") or ""
                    upload_id = upload.findtext(f"{_S3_NS}UploadId") or ""
                    started = _parse_time(upload.findtext(f"{_S3_NS}Initiated") or "")
                    if not key or not upload_id or started is None:
                        continue
                    shown = key[len(base) :] if key.startswith(base) else key
                    found.append(
                        StagingLeftover(
                            f"{shown}?uploadId={upload_id}", started, key=key, upload_id=upload_id
                        )
                    )
                if (root.findtext(f"{_S3_NS}IsTruncated") or "").lower() != "true":
                    break
                query = {
                    **query,
                    "key-marker": root.findtext(f"{_S3_NS}NextKeyMarker") or "",
                    "upload-id-marker": root.findtext(f"{_S3_NS}NextUploadIdMarker") or "",
                }
        return found

    def abort(self, key: str, upload_id: str) -> None:
        self._request("DELETE", self._object_path(key), {"uploadId": upload_id})


# --------------------------------------------------------------------- credentials

_Credentials = tuple[str, str, str | None]  # key id, secret, session token
_STS_NS = "{https://sts.amazonaws.com/doc/2011-06-15/}"
_ECS_HOST = "http://169.254.170.2"
_IMDS_ENDPOINT = "http://169.254.169.254"
_CREDENTIAL_TIMEOUT_S = 5


def _setting(config: dict[str, Any], name: str, *variables: str) -> str | None:
    """A store setting as obstore reads it: its config, then its variables."""
    value = config.get(name)
    if value:
        return str(value)
    for variable in variables:
        if os.environ.get(variable):
            return os.environ[variable]
    return None


async def _credentials(store: Any, config: dict[str, Any], region: str) -> _Credentials:
    """The store's credentials, from the first source of obstore's chain that
    is configured (module docstring). Raises OSError/ValueError when none is,
    or the one configured does not answer."""
    provider = getattr(store, "credential_provider", None)
    if provider is not None:
        given = provider()
        if asyncio.iscoroutine(given):
            given = await given
        return (str(given["access_key_id"]), str(given["secret_access_key"]), given.get("token"))
    key_id = _setting(config, "access_key_id", "AWS_ACCESS_KEY_ID")
    secret = _setting(config, "secret_access_key", "AWS_SECRET_ACCESS_KEY")
    token = _setting(config, "session_token", "AWS_SESSION_TOKEN", "AWS_TOKEN") or _setting(
        config, "token"
    )
    if key_id or secret:
        if not (key_id and secret):
            raise ValueError("an access key id without its secret, or a secret without its id")
        return key_id, secret, token
    return await asyncio.to_thread(_credentials_from_services, config, region)


def _credentials_from_services(config: dict[str, Any], region: str) -> _Credentials:
    token_file = _setting(config, "web_identity_token_file", "AWS_WEB_IDENTITY_TOKEN_FILE")
    role_arn = _setting(config, "role_arn", "AWS_ROLE_ARN")
    if token_file and role_arn:
        return _web_identity(config, token_file, role_arn, region)
    relative = _setting(
        config, "container_credentials_relative_uri", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"
    )
    if relative:
        return _from_json(_http("GET", _ECS_HOST + relative, {}))
    full = _setting(config, "container_credentials_full_uri", "AWS_CONTAINER_CREDENTIALS_FULL_URI")
    auth_file = _setting(
        config, "container_authorization_token_file", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"
    )
    if full and auth_file:
        with open(auth_file, encoding="utf-8") as file:
            authorization = file.read().strip()
        return _from_json(_http("GET", full, {"Authorization": authorization}))
    return _instance_credentials(config)


def _web_identity(
    config: dict[str, Any], token_file: str, role_arn: str, region: str
) -> _Credentials:
    with open(token_file, encoding="utf-8") as file:
        web_token = file.read().strip()
    session = os.environ.get("AWS_ROLE_SESSION_NAME") or "WebIdentitySession"
    endpoint = _setting(config, "sts_endpoint", "AWS_ENDPOINT_URL_STS") or (
        f"https://sts.{region}.amazonaws.com"
    )
    query = urlencode(
        {
            "Action": "AssumeRoleWithWebIdentity",
            "DurationSeconds": "3600",
            "RoleArn": role_arn,
            "RoleSessionName": session,
            "Version": "2011-06-15",
            "WebIdentityToken": web_token,
        }
    )
    root = ElementTree.fromstring(_http("POST", f"{endpoint.rstrip('/')}/?{query}", {}))
    found = root.find(f".//{_STS_NS}Credentials")
    if found is None:
        raise ValueError("the STS answer holds no credentials")
    return (
        found.findtext(f"{_STS_NS}AccessKeyId") or "",
        found.findtext(f"{_STS_NS}SecretAccessKey") or "",
        found.findtext(f"{_STS_NS}SessionToken"),
    )


def _instance_credentials(config: dict[str, Any]) -> _Credentials:
    endpoint = (
        _setting(config, "metadata_endpoint", "AWS_METADATA_ENDPOINT") or _IMDS_ENDPOINT
    ).rstrip("/")
    fallback = (_setting(config, "imdsv1_fallback", "AWS_IMDSV1_FALLBACK") or "").lower() in (
        "true",
        "1",
    )
    headers: dict[str, str] = {}
    try:
        session = _http(
            "PUT",
            f"{endpoint}/latest/api/token",
            {"X-aws-ec2-metadata-token-ttl-seconds": "21600"},
        )
        headers["X-aws-ec2-metadata-token"] = session.decode()
    except urllib.error.HTTPError as error:
        if not (fallback and error.code == 403):
            raise
    base = f"{endpoint}/latest/meta-data/iam/security-credentials/"
    role = _http("GET", base, headers).decode().strip().splitlines()[0]
    return _from_json(_http("GET", base + role, headers))


def _from_json(body: bytes) -> _Credentials:
    given = json.loads(body)
    return str(given["AccessKeyId"]), str(given["SecretAccessKey"]), given.get("Token")


def _http(method: str, url: str, headers: dict[str, str]) -> bytes:
    request = urllib.request.Request(url, method=method, headers=headers)
    with urllib.request.urlopen(request, timeout=_CREDENTIAL_TIMEOUT_S) as response:  # noqa: S310
        body: bytes = response.read()
        return body


def _parse_time(text: str) -> int | None:
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return int(moment.timestamp() * 1000)


__all__ = ["StagingLeftover", "StagingUnavailableError", "list_staging", "remove_staging"]
