"""Shared pytest configuration: service fixtures live in tests/fixtures/."""

pytest_plugins = ["tests.fixtures.postgres", "tests.fixtures.s3"]
