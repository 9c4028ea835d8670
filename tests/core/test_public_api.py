"""The public surface is pinned, documented with examples, and imports no engine."""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap

import kvcompat
import kvcompat.adapters
import kvcompat.testing

PUBLIC = [
    "CompatPool",
    "ImplError",
    "KVCompatError",
    "KVPair",
    "KVPoolProtocol",
    "KernelUnavailableError",
    "LayerIdTypeError",
    "LayerOutOfRangeError",
    "LayoutError",
    "NoValueBufferError",
    "PoolKind",
    "PoolStateError",
    "SupportsGetKeyBuffer",
    "UnsupportedPoolError",
    "WriteError",
    "__version__",
    "adapt",
    "adapters",
    "compat",
    "describe",
    "is_composite_pool",
    "is_key_only_pool",
    "is_latent_pool",
    "is_single_kv_pool",
    "is_split_kv_pool",
    "is_supported_pool",
    "memory_report",
    "pool_kind",
    "register_adapter",
    "transfer_descriptors",
    "unregister_adapter",
]


def test_all_is_pinned_and_sorted() -> None:
    assert kvcompat.__all__ == PUBLIC
    assert sorted(kvcompat.__all__) == kvcompat.__all__
    for module in (kvcompat.adapters, kvcompat.testing):
        assert sorted(module.__all__) == module.__all__
        assert all(hasattr(module, name) for name in module.__all__)


def public_objects() -> list[tuple[str, object]]:
    objects: list[tuple[str, object]] = []
    for module in (kvcompat, kvcompat.adapters, kvcompat.testing):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.ismodule(obj) or name == "__version__":
                continue
            objects.append((f"{module.__name__}.{name}", obj))
            if inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    if attr.startswith("_") or not (
                        inspect.isfunction(member) or isinstance(member, property)
                    ):
                        continue
                    if obj.__module__.startswith("kvcompat.testing"):
                        continue  # stand-ins document SGLang's methods in one line each
                    objects.append((f"{module.__name__}.{name}.{attr}", member))
    return objects


def test_every_public_name_has_a_docstring_with_an_example() -> None:
    missing = []
    for name, obj in public_objects():
        doc = inspect.getdoc(obj) or ""
        owner = getattr(kvcompat, name.split(".")[1], None)
        is_protocol_member = name.count(".") == 2 and getattr(owner, "_is_protocol", False)
        # a protocol's members need a docstring; the protocol's own carries the example
        ok = bool(doc) if is_protocol_member else "Example:" in doc and ">>>" in doc
        if not ok:
            missing.append(name)
    assert missing == []


def test_import_and_detectors_leave_sglang_and_triton_unimported() -> None:
    code = textwrap.dedent(
        """
        import sys
        import kvcompat
        from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool, reference_swa_pool
        objs = [ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64), reference_swa_pool(),
                object(), 3, ReferenceDeepSeekV4SingleKVPool]
        for obj in objs:
            for fn in (kvcompat.pool_kind, kvcompat.is_single_kv_pool, kvcompat.is_split_kv_pool,
                       kvcompat.is_latent_pool, kvcompat.is_key_only_pool,
                       kvcompat.is_composite_pool, kvcompat.is_supported_pool):
                fn(obj)
        pool = kvcompat.adapt(objs[0])
        pool.get_kv_buffer(0)
        leaked = sorted(m for m in sys.modules if m.split(".")[0] in ("sglang", "triton"))
        print(leaked)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
