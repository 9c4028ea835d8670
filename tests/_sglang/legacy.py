"""A test double of ``DeepSeekV4SingleKVPool`` as SGLang 0.5.12 shipped it (survey §4).

What it models is 0.5.12's real class, checked against that release's wheel
(``shared/reference/sglang-releases.md``; the release matrix runs 0.5.12 itself too):

* **No ``KVLayout``**: the enum, the ``kv_layout`` class attribute and the ``kv_layout`` /
  ``global_page_size`` constructor arguments arrived in 0.5.21. Until then the only main-KV
  format was the 584-byte V4 layout.
* ``quantize_block_size = 64`` was a literal (0.5.21 on: ``kv_layout.tile_size``).
* The page count was ``(size + page_size + 1) // page_size`` (0.5.12-0.5.20; 0.5.21 on:
  ``ceil((size + global_page_size) / page_size)``). For ``size=100, page_size=64`` that is 2
  pages where 0.5.23 allocates 3.
* ``get_key_buffer(layer_id)`` returned ``self.kv_buffer[layer_id]``: the raw uint8 page
  buffer, no float8 dtype view and no ``start_layer`` subtraction. That is true of 0.5.12
  only: from 0.5.13 the getter has 0.5.23's ``store_dtype != dtype`` branch (also 0.5.18 and
  0.5.19, the releases around the 2026-08-27 error report), so across versions a shim sees
  either a uint8 or a float8-typed view, with or without ``start_layer`` applied -- this
  double puts 0.5.12's side on top of whichever release is installed.

The double is a *subclass of the real* ``DeepSeekV4SingleKVPool`` (so detection by class name
along the MRO sees it), built lazily because defining it imports SGLang.

About hiding ``kv_layout``: the real class defines it as a class attribute, which a subclass
cannot delete, so the double shadows it with a property that raises AttributeError.
``getattr``/``hasattr``/``getattr(pool, "kv_layout", None)`` then behave as on the old class.
``inspect.getattr_static(pool, "kv_layout")`` still finds *something* -- the property object,
not a ``KVLayout`` -- so a static probe must treat "not a KVLayout-like value" as "absent".
The writers (``set_key_buffer`` / ``set_key_buffer_fused``) need GPU kernels in every version;
the double keeps the old signatures and refuses with NotImplementedError.
"""

from __future__ import annotations

import functools
from typing import Any, NoReturn

import torch

from _sglang.builders import DEVICE, DSV4_PAGE, SIZE, STAGE_END, EndLayer, end_layer_kwargs
from _sglang.env import prepare_sglang

__all__ = [
    "LEGACY_BYTES_PER_TOKEN",
    "LEGACY_QUANTIZE_BLOCK_SIZE",
    "build_legacy_dsv4_single_pool",
    "legacy_dsv4_single_pool_class",
    "legacy_num_pages",
]

LEGACY_QUANTIZE_BLOCK_SIZE = 64
LEGACY_BYTES_PER_TOKEN = 584  # 448 e4m3 nope + 64 bf16 rope + 7 ue8m0 scales + 1 pad
_V4_PAGE_ALIGN = 576


def legacy_num_pages(size: int, page_size: int) -> int:
    """The older page count, ``(size + page_size + 1) // page_size``."""
    return (size + page_size + 1) // page_size


@functools.cache
def legacy_dsv4_single_pool_class() -> type:
    """Define (once) and return ``LegacyDeepSeekV4SingleKVPool``; imports SGLang."""
    session = prepare_sglang()
    real = session.deepseek_v4_memory_pool.DeepSeekV4SingleKVPool
    kv_cache = session.memory_pool.KVCache

    class LegacyDeepSeekV4SingleKVPool(real):  # type: ignore[misc, valid-type]
        """``DeepSeekV4SingleKVPool`` as of 0.5.12 (no kv_layout; raw-index uint8 getter)."""

        def __init__(
            self,
            size: int,
            page_size: int,
            dtype: torch.dtype,
            qk_nope_head_dim: int,
            qk_rope_head_dim: int,
            layer_num: int,
            device: str,
            enable_memory_saver: bool,
            start_layer: int | None = None,
            end_layer: int | None = None,
        ) -> None:
            # The real __init__ assigns self.kv_layout, which the property below forbids,
            # so the old initialisation is spelled out: base KVCache set-up, then buffers.
            kv_cache.__init__(
                self,
                size,
                page_size,
                dtype,
                layer_num,
                device,
                enable_memory_saver,
                start_layer,
                end_layer,
            )
            self.qk_nope_head_dim = qk_nope_head_dim
            self.qk_rope_head_dim = qk_rope_head_dim
            self.scale_pad = 1
            self.quantize_block_size = LEGACY_QUANTIZE_BLOCK_SIZE
            self.rope_storage_dtype = torch.bfloat16
            self.k_with_scale_buffer_dtype = torch.int8
            self._create_buffers()

        @property
        def kv_layout(self) -> NoReturn:
            msg = (
                f"{type(self).__name__!r} object has no attribute 'kv_layout' "
                "(DeepSeekV4SingleKVPool before KVLayout existed)"
            )
            raise AttributeError(msg)

        def _create_buffers(self) -> None:
            pages = legacy_num_pages(self.size, self.page_size)
            self.kv_buffer = [self.create_buffer(num_pages=pages) for _ in range(self.layer_num)]

        def get_bytes_per_token(self) -> int:
            return (
                self.qk_nope_head_dim
                + self.qk_rope_head_dim * self.rope_storage_dtype.itemsize
                + self.qk_nope_head_dim // self.quantize_block_size
                + self.scale_pad
            )

        def create_buffer(self, *, num_pages: int) -> torch.Tensor:
            bytes_per_token = self.get_bytes_per_token()
            if bytes_per_token != LEGACY_BYTES_PER_TOKEN:
                msg = f"the V4 layout is {LEGACY_BYTES_PER_TOKEN} B/token, got {bytes_per_token}"
                raise ValueError(msg)
            if self.store_dtype != torch.uint8:
                msg = f"store dtype must be uint8 (an fp8 dtype), got {self.store_dtype}"
                raise ValueError(msg)
            self.kv_cache_total_dim = bytes_per_token
            raw = self.page_size * bytes_per_token
            self.bytes_per_page_padded = -(-raw // _V4_PAGE_ALIGN) * _V4_PAGE_ALIGN
            return torch.zeros(
                num_pages, self.bytes_per_page_padded, dtype=self.store_dtype, device=self.device
            )

        def get_key_buffer(self, layer_id: int) -> torch.Tensor:
            return self.kv_buffer[layer_id]

        def set_key_buffer(self, layer_id: int, loc: torch.Tensor, pack: Any) -> NoReturn:
            del layer_id, loc, pack
            msg = "LegacyDeepSeekV4SingleKVPool does not model writers (GPU kernels only)"
            raise NotImplementedError(msg)

        def set_key_buffer_fused(
            self, layer_id: int, loc: torch.Tensor, cache_k: torch.Tensor
        ) -> NoReturn:
            del layer_id, loc, cache_k
            msg = "LegacyDeepSeekV4SingleKVPool does not model writers (GPU kernels only)"
            raise NotImplementedError(msg)

    return LegacyDeepSeekV4SingleKVPool


def build_legacy_dsv4_single_pool(
    *,
    start_layer: int = 0,
    layer_num: int = 2,
    end_layer: EndLayer = STAGE_END,
    size: int = SIZE,
    page_size: int = DSV4_PAGE,
    dtype: torch.dtype = torch.float8_e4m3fn,
) -> Any:
    """A fresh ``LegacyDeepSeekV4SingleKVPool`` (V4 layout: 448 + 64 dims) on CPU."""
    cls = legacy_dsv4_single_pool_class()
    return cls(
        size,
        page_size,
        dtype,
        448,
        64,
        layer_num,
        DEVICE,
        False,  # enable_memory_saver
        start_layer=start_layer,
        **end_layer_kwargs(start_layer, layer_num, end_layer),
    )
