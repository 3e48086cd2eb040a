"""open_blobs(url): schemes, settings from the environment, and refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
from obstore.store import AzureStore, GCSStore, LocalStore, MemoryStore, S3Store

from checkpointd.blobs import BlobStoreError, ObjectBlobStore, open_blobs
from checkpointd.errors import SandboxCheckpointInvalidArgumentError

S3_VARIABLES = (
    "CHECKPOINTD_S3_ENDPOINT",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in S3_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


async def test_memory_stores_are_separate() -> None:
    first, second = open_blobs("memory://"), open_blobs("memory://")
    assert isinstance(first.object_store, MemoryStore)
    await first.put("k", b"1")
    assert await second.head("k") is None
    assert first.url == "memory://"


async def test_file_store_creates_its_directory(tmp_path: Path) -> None:
    root = tmp_path / "not" / "yet"
    blobs = open_blobs(f"file://{root}")
    assert isinstance(blobs.object_store, LocalStore)
    assert root.is_dir()
    await blobs.put("sandbox-files/blake3/abc", b"bytes")
    assert (root / "sandbox-files" / "blake3" / "abc").read_bytes() == b"bytes"
    # A second store on the same directory sees the blobs.
    assert await open_blobs(f"file://{root}").get("sandbox-files/blake3/abc") == b"bytes"


def test_file_store_percent_escapes(tmp_path: Path) -> None:
    open_blobs(f"file://{tmp_path}/with%20space")
    assert (tmp_path / "with space").is_dir()


@pytest.mark.parametrize(
    "url",
    [
        "ftp://host/x",
        "http://bucket/x",
        "no-scheme",
        "file://relative/dir",
        "file://host/abs",
        "s3:///no-bucket",
        "s3://key:secret@bucket/prefix",
    ],
)
def test_rejected_urls(url: str) -> None:
    with pytest.raises(SandboxCheckpointInvalidArgumentError) as caught:
        open_blobs(url)
    assert "secret" not in str(caught.value)
    if "@" not in url:
        assert url in str(caught.value)


def test_file_path_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("x")
    with pytest.raises(SandboxCheckpointInvalidArgumentError):
        open_blobs(f"file://{tmp_path / 'plain'}")


def test_options_that_do_not_apply(tmp_path: Path) -> None:
    with pytest.raises(SandboxCheckpointInvalidArgumentError):
        open_blobs("memory://", endpoint="http://127.0.0.1:1")
    with pytest.raises(SandboxCheckpointInvalidArgumentError):
        open_blobs(f"file://{tmp_path}", region="us-east-1")
    with pytest.raises(SandboxCheckpointInvalidArgumentError):
        open_blobs("gs://bucket", endpoint="http://127.0.0.1:1")


def test_gcs_and_azure_are_built_through_obstore(clean_env: pytest.MonkeyPatch) -> None:
    gcs = open_blobs("gs://a-bucket/some/prefix", skip_signature=True)
    assert isinstance(gcs.object_store, GCSStore)
    assert gcs.object_store.prefix == "some/prefix"
    assert gcs.url == "gs://a-bucket/some/prefix"
    azure = open_blobs("az://container/prefix", account_name="acct", account_key="a2V5")
    assert isinstance(azure.object_store, AzureStore)
    assert azure.url == "az://container/prefix"


def test_configuration_obstore_rejects(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("AWS_ACCESS_KEY_ID", "key-without-secret")
    with pytest.raises(SandboxCheckpointInvalidArgumentError) as caught:
        open_blobs("s3://bucket/prefix")
    assert "s3://bucket/prefix" in str(caught.value)
    with pytest.raises(SandboxCheckpointInvalidArgumentError):
        open_blobs("s3://bucket", not_an_obstore_option="x")


def test_s3_settings(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("CHECKPOINTD_S3_ENDPOINT", "http://127.0.0.1:9")
    clean_env.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:8")
    blobs = open_blobs("s3://bucket/a/b", access_key_id="k", secret_access_key="s", region="r1")
    store = blobs.object_store
    assert isinstance(store, S3Store)
    assert store.prefix == "a/b"
    assert store.config["endpoint"] == "http://127.0.0.1:9"  # ours wins over AWS_*
    assert store.config["region"] == "r1"
    assert store.client_options is not None
    assert str(store.client_options["allow_http"]).lower() == "true"
    assert blobs.url == "s3://bucket/a/b"
    override = open_blobs(
        "s3://bucket", endpoint="https://r2.example", access_key_id="k", secret_access_key="s"
    )
    assert isinstance(override.object_store, S3Store)
    assert override.object_store.config["endpoint"] == "https://r2.example"
    assert not override.object_store.client_options  # https: no allow_http


@pytest.mark.s3
async def test_s3_from_the_environment(clean_env: pytest.MonkeyPatch, s3_server) -> None:
    for name, value in s3_server.env().items():
        clean_env.setenv(name, value)
    blobs = open_blobs(s3_server.url("from-env"))
    await blobs.put("sandbox-files/x", b"through the environment")
    assert await s3_server.open("from-env").get("sandbox-files/x") == b"through the environment"
    # AWS_ENDPOINT_URL alone works too (obstore reads it; we add allow_http).
    clean_env.delenv("CHECKPOINTD_S3_ENDPOINT")
    clean_env.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    assert await open_blobs(s3_server.url("from-env")).get("sandbox-files/x") == (
        b"through the environment"
    )


@pytest.mark.s3
async def test_s3_denied_names_store_and_key_not_secret(s3_server) -> None:
    blobs: ObjectBlobStore = open_blobs(
        s3_server.url("denied"),
        endpoint=s3_server.endpoint,
        region=s3_server.region,
        access_key_id=s3_server.access_key_id,
        secret_access_key="wrong-secret-value",
    )
    for attempt in (blobs.put("sandbox-files/k", b"x"), blobs.get("sandbox-files/k")):
        with pytest.raises(BlobStoreError) as caught:
            await attempt
        message = str(caught.value)
        assert s3_server.url("denied") in message and "sandbox-files/k" in message
        assert "wrong-secret-value" not in message
