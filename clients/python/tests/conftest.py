"""The live gateway these tests talk to: gateway/tests/e2e/python_sdk.rs starts one (real dockerd,
runsc, PostgreSQL) and passes its URL and keys in the environment."""

import os

import pytest

from sandgate import AsyncClient, Client


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: run these tests through `cargo test -p gateway --test e2e -- python_sdk::`")
    return value


@pytest.fixture(scope="session")
def url() -> str:
    return _env("SANDGATE_URL")


@pytest.fixture(scope="session")
def key() -> str:
    return _env("SANDGATE_KEY")


@pytest.fixture(scope="session")
def reviewer_key() -> str:
    return _env("SANDGATE_REVIEWER_KEY")


@pytest.fixture(scope="session")
def other_tenant_key() -> str:
    """An agent of `classroom`: another tenant, which the shipped policy lets open no sessions."""
    return _env("SANDGATE_OTHER_KEY")


@pytest.fixture
def client(url: str, key: str):
    with Client(url, key) as client:
        yield client


@pytest.fixture
async def aclient(url: str, key: str):
    async with AsyncClient(url, key) as client:
        yield client
