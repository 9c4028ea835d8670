"""kvcompat's errors report the public module users import them from, and still pickle."""

from __future__ import annotations

import importlib
import pickle
import subprocess
import sys
import traceback

import pytest

import kvcompat
from kvcompat import _errors

ERRORS = [getattr(_errors, name) for name in _errors.__all__]


@pytest.mark.parametrize("cls", ERRORS, ids=lambda cls: cls.__name__)
def test_error_names_the_public_module(cls: type[Exception]) -> None:
    assert cls.__module__ == "kvcompat"
    assert getattr(kvcompat, cls.__name__) is cls
    assert repr(cls) == f"<class 'kvcompat.{cls.__name__}'>"
    exc = cls("what was received; Hint: what to do")
    line = traceback.format_exception_only(exc)[-1]
    assert line == f"kvcompat.{cls.__name__}: what was received; Hint: what to do\n"


@pytest.mark.parametrize("cls", ERRORS, ids=lambda cls: cls.__name__)
def test_error_pickles_by_its_public_name(cls: type[Exception]) -> None:
    exc = cls("message")
    data = pickle.dumps(exc)
    assert b"kvcompat._errors" not in data
    back = pickle.loads(data)
    assert type(back) is cls
    assert back.args == ("message",)


def test_a_raised_error_unpickles_in_a_fresh_process() -> None:
    try:
        kvcompat.adapt([])
    except kvcompat.UnsupportedPoolError as exc:
        data = pickle.dumps(exc)
    code = (
        "import pickle, sys; exc = pickle.loads(sys.stdin.buffer.read()); "
        "print(type(exc).__module__, type(exc).__name__, isinstance(exc, TypeError))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], input=data, capture_output=True, check=True
    )
    assert result.stdout.decode().split() == ["kvcompat", "UnsupportedPoolError", "True"]


@pytest.mark.parametrize(
    ("value", "got"),
    [(None, "got None"), ({}, "got dict {}"), ([1, 2], "got list [1, 2]"), (3, "got int 3")],
)
def test_adapt_says_a_builtin_is_not_a_pool(value: object, got: str) -> None:
    with pytest.raises(kvcompat.UnsupportedPoolError) as info:
        kvcompat.adapt(value)
    message = str(info.value)
    assert message.startswith(
        f"adapt() takes a KV pool, {got}: a builtin value or container is not a pool.\nHint: "
    )
    assert "model_runner.token_to_kv_pool" in message
    assert "register_adapter" not in message, "a builtin is never a pool to teach"


def test_adapt_says_a_tensor_is_a_buffer_not_a_pool() -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(kvcompat.UnsupportedPoolError) as info:
        kvcompat.adapt(torch.zeros(4, 2, dtype=torch.bfloat16))
    message = str(info.value)
    assert message.startswith(
        "adapt() takes a KV pool, got a tensor (torch.Tensor, shape [4, 2], dtype "
        "torch.bfloat16): a tensor is a pool's buffer, not a pool.\nHint: pass the pool object"
    )
    assert "register_adapter" not in message


def test_adapt_still_offers_register_adapter_for_an_unknown_class() -> None:
    class VendorPool:
        pass

    with pytest.raises(kvcompat.UnsupportedPoolError, match=r'register_adapter\(".*VendorPool"'):
        kvcompat.adapt(VendorPool())


@pytest.mark.parametrize(
    ("public", "name"),
    [
        ("kvcompat.compat", "CompatViewError"),
        ("kvcompat.transfer", "TransferPlanError"),
        ("kvcompat.transfer", "TransferError"),
        ("kvcompat.testing", "PoolCheckError"),
    ],
)
def test_the_other_errors_name_the_module_users_import_them_from(public: str, name: str) -> None:
    module = importlib.import_module(public)
    cls = getattr(module, name)
    assert cls.__module__ == public
    assert repr(cls) == f"<class '{public}.{name}'>"
    if name != "PoolCheckError":  # its constructor takes a report, not a message
        back = pickle.loads(pickle.dumps(cls("message")))
        assert type(back) is cls
